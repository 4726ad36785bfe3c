"""How well each AI annotator (an LLM judge, a reward model) agrees with people, per round.

Practice from AlpacaFarm (Dubois et al. 2023, §3: simulated annotators are validated by their
agreement with the human majority) and MT-Bench (Zheng et al. 2023, §4.2: agreement of GPT-4
judgments with human experts). Each AI account is compared on its own, never pooled with
another: on every item that also has human labels, the credit is 1 when its label equals the
human majority (1/m for one of m tied human modes); Cohen's kappa against the human majority
is over the items where that majority is unique. Rankings are compared by Kendall's tau-b with
the humans' mean ranks. The rule and the intervals are `evaluation.stats.agreement_report.
cross_source`, the same figures the agreement report gives for a whole source.

Labels counted: primary (no repeats, no gold) and not flagged by quality control, as for the
agreement report.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model

from annotation.labels import PAIRWISE_LABELS, label_of
from annotation.models import Judgment, LabelSource, Project, Round, TaskKind
from evaluation.qc_metrics import rater_key
from evaluation.stats import agreement_report
from evaluation.stats.agreement_report import RatedLabel


def ai_agreement_by_annotator(
    *, project: Project, round_: Round | None = None, n_boot: int = 1000, seed: int = 0
) -> list[dict]:
    """Return per round and AI annotator its agreement with the human labels of its items.

    Shape: ``[{"round", "annotator_id", "username", "description", "metric"
    ("consensus_agreement" | "kendall_tau_b"), "agreement": CI | None, "kappa",
    "n_items" (items compared), "n_decided" (of those, with a unique human majority;
    pairwise only)}]``, rounds in order, then annotators by name; CI is
    ``{"estimate", "low", "high", "n_valid"}``.
    """
    judgments = (
        Judgment.objects.filter(project=project, source__in=[LabelSource.HUMAN, LabelSource.AI])
        .primary()
        .unflagged()
    )
    if round_ is not None:
        judgments = judgments.filter(item__round=round_)
    ranking = project.task_kind == TaskKind.RANKING
    votes = []
    ai_accounts: set[int] = set()
    for item_id, annotator_id, external, source, choice, ranks, number in judgments.order_by(
        "id"
    ).values_list(
        "item_id",
        "annotator_id",
        "external_rater",
        "source",
        "choice",
        "ranking",
        "item__round__number",
    ):
        label = label_of(choice, ranks)
        if isinstance(label, tuple) != ranking or (not ranking and label not in PAIRWISE_LABELS):
            continue  # a label of the other task kind cannot be compared
        if source == LabelSource.AI:
            if annotator_id is None:
                continue
            ai_accounts.add(annotator_id)
            # One "source" per AI account, so cross_source keeps them apart.
            source = f"ai:{annotator_id}"
        votes.append(RatedLabel(item_id, rater_key(annotator_id, external), source, label, number))
    if not ai_accounts:
        return []
    rows = agreement_report.cross_source(
        votes,
        reference=LabelSource.HUMAN,
        ranking=ranking,
        categories=PAIRWISE_LABELS,
        n_boot=n_boot,
        seed=seed,
    )
    accounts = {
        pk: (username, last_name)
        for pk, username, last_name in get_user_model()
        .objects.filter(pk__in=ai_accounts)
        .values_list("pk", "username", "last_name")
    }
    out = []
    for row in rows:
        annotator_id = int(row["source"].removeprefix("ai:"))
        username, description = accounts[annotator_id]
        out.append(
            {
                "round": row["round"],
                "annotator_id": annotator_id,
                "username": username,
                "description": description,
                "metric": row["metric"],
                "agreement": row["agreement"],
                "kappa": row["kappa"],
                "n_items": row["n_items"],
                "n_decided": row.get("n_decided"),
            }
        )
    return sorted(out, key=lambda r: (r["round"], r["username"]))
