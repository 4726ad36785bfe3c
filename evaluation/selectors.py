"""Read-side QC queries: agreement, annotator quality, label distribution, disagreement queue.

These load judgments in a few queries and hand them to the computations: agreement blocks in
`evaluation.stats.agreement_report`, per-annotator figures and label tallies in
`evaluation.qc_metrics`, review payloads in `evaluation.review`. Results are JSON-ready.

Scope of the labels: agreement and label counts use primary labels, i.e. repeats (the same
annotator twice) and gold items are left out unless asked for, and labels flagged by QC are
left out unless ``include_flagged``. Label sources (human, ai, simulated, imported) are never
pooled: each is reported in its own block, and AI (or simulated) labels are compared with
human ones per round in ``cross_source``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from functools import partial

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import BooleanField, Count, Max, Q, Sum
from django.db.models.expressions import RawSQL
from django.db.models.functions import Length

from annotation.exports import gold_weights
from annotation.labels import PAIRWISE_LABELS, label_of
from annotation.models import (
    Adjudication,
    Assignment,
    Item,
    ItemCandidate,
    Judgment,
    LabelSource,
    Membership,
    Project,
    Round,
    TaskKind,
)
from annotation.querysets import flagged_q, is_counted_row
from annotation.services import SOURCE_GROUPS
from evaluation import qc_metrics, review
from evaluation.models import AgreementReport, AnnotatorAssessment, QualityPolicy
from evaluation.qc_metrics import AnnotatorQuality, Rater, rater_key
from evaluation.stats import agreement_report
from evaluation.stats.agreement_report import RatedLabel
from evaluation.stats.quality import SkipRate

REFERENCE_SOURCE = LabelSource.HUMAN
DEFAULT_TRUST = 0.5  # (0 + 1) / (0 + 2): no gold answers yet


def _rater_names(raters: Iterable[Rater]) -> dict[Rater, str]:
    """Return display names: usernames for accounts, the external name otherwise."""
    raters = list(raters)
    ids = [r for r in raters if isinstance(r, int)]
    names: dict[Rater, str] = dict(
        get_user_model().objects.filter(pk__in=ids).values_list("pk", "username")
    )
    for rater in raters:
        if not isinstance(rater, int):
            names[rater] = rater[4:]
    return names


# ---- policy --------------------------------------------------------------------------------


def quality_policy_get(*, project: Project) -> QualityPolicy:
    """Return the project's QC policy, or an unsaved one with the defaults."""
    policy = QualityPolicy.objects.filter(project=project).first()
    return policy if policy is not None else QualityPolicy(project=project)


# ---- agreement -----------------------------------------------------------------------------


def _votes(
    *, project: Project, round_: Round | None, include_gold: bool, include_flagged: bool
) -> list[RatedLabel]:
    """Load primary labels (no repeats) in one query, oldest first."""
    judgments = Judgment.objects.filter(project=project).without_repeats()
    if round_ is not None:
        judgments = judgments.filter(item__round=round_)
    if not include_gold:
        judgments = judgments.without_gold()
    if not include_flagged:
        judgments = judgments.unflagged()
    rows = judgments.order_by("id").values_list(
        "item_id",
        "annotator_id",
        "external_rater",
        "source",
        "choice",
        "ranking",
        "item__round__number",
    )
    return [
        RatedLabel(
            item_id, rater_key(annotator_id, external), source, label_of(choice, ranking), number
        )
        for item_id, annotator_id, external, source, choice, ranking, number in rows
    ]


def project_agreement(
    *,
    project: Project,
    round_: Round | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    min_shared_items: int = 10,
    include_gold: bool = False,
    include_flagged: bool = False,
) -> dict:
    """Return inter-rater agreement of a project (or one round), one block per label source.

    Pairwise projects: Krippendorff's alpha (nominal, over A / B / tie / both_bad), percent
    agreement, Fleiss' kappa (items with the full overlap), the annotator x annotator Cohen's
    kappa matrix (pairs sharing at least ``min_shared_items`` items) and each annotator's
    agreement with the leave-one-out consensus (share of their labels equal to the others'
    modal label; 1/m for one of m tied modes). Ranking projects: ordinal alpha over the ranks
    (units = item x candidate position), mean Kendall tau-b over rater pairs, a tau-b matrix,
    and tau-b against the others' mean ranks. Every figure has a percentile bootstrap interval
    from resampling items (``n_boot`` replicates, ``seed``).

    Shape::

        {"project_id", "round" (number or None), "task_kind", "n_boot", "seed",
         "sources": ["human", ...],               # sources present, human first
         "by_source": {source: {
             "level", "labels", "n_items" (with >= 2 labels), "n_judgments", "n_annotators",
             "alpha": CI | None, "percent_agreement": CI | None,
             "fleiss_kappa": CI + {"n_items", "n_raters"} | None,    # pairwise only
             "kendall_tau": CI | None,                               # ranking only
             "pairwise": {"metric", "min_shared_items", "annotators": [{"id", "name"}],
                          "matrix": [[float | None]], "n_shared": [[int]],
                          "pairs": [{"a", "b", "n_shared", "estimate", "low", "high"}]},
             "leave_one_out": [{"annotator_id", "name", "n_items", "agreement": CI | None}]}},
         "cross_source": [{"round", "source", "reference": "human", "n_items", "metric",
                           "agreement": CI | None, "kappa", "n_decided"}]}

    where CI is ``{"estimate", "low", "high", "n_valid"}``. Human labels are the headline
    (``by_source["human"]``); the other sources are computed the same way but never pooled.
    """
    votes = _votes(
        project=project, round_=round_, include_gold=include_gold, include_flagged=include_flagged
    )
    ranking = project.task_kind == TaskKind.RANKING
    # A label of the other task kind (e.g. a stray import) cannot be compared: leave it out.
    votes = [v for v in votes if isinstance(v.label, tuple) == ranking]
    if not ranking:
        votes = [v for v in votes if v.label in PAIRWISE_LABELS]
    names = _rater_names({vote.rater for vote in votes})
    sources = qc_metrics.sources_in_order(vote.source for vote in votes)
    common = {"n_boot": n_boot, "seed": seed}
    block = (
        partial(agreement_report.ranking_block, k=project.k)
        if ranking
        else partial(
            agreement_report.pairwise_block, categories=PAIRWISE_LABELS, overlap=project.overlap
        )
    )
    by_source = {
        source: block(
            agreement_report.by_item(vote for vote in votes if vote.source == source),
            names,
            min_shared_items=min_shared_items,
            **common,
        )
        for source in sources
    }
    cross = agreement_report.cross_source(
        votes, reference=REFERENCE_SOURCE, ranking=ranking, categories=PAIRWISE_LABELS, **common
    )
    return {
        "project_id": project.pk,
        "round": round_.number if round_ is not None else None,
        "task_kind": project.task_kind,
        "n_boot": n_boot,
        "seed": seed,
        "sources": sources,
        "by_source": by_source,
        "cross_source": cross,
    }


def agreement_report_latest(
    *, project: Project, round_: Round | None = None
) -> AgreementReport | None:
    """Return the newest stored agreement report of a project (or one round), or None."""
    return (
        AgreementReport.objects.filter(project=project, round=round_)
        .order_by("-created_at", "-id")
        .first()
    )


# ---- label distribution --------------------------------------------------------------------


def label_distribution(
    *, project: Project, round_: Round | None = None, include_flagged: bool = False
) -> dict:
    """Return label counts per source, and how often the left-hand answer was chosen.

    Primary labels only (no gold items, no repeats). Shape::

        {"project_id", "round", "task_kind", "n_flagged" (QC-flagged labels left out),
         "by_source": {source: {
             "n": int,
             "counts": {"A", "B", "tie", "both_bad"},          # pairwise
             "shares": {"A", "B", "tie", "both_bad"},
             "rank_counts": [[n of rank r+1 at position p]],   # ranking: positions x ranks
             "left": int, "right": int, "left_share": float | None}}}

    "left" counts A/B decisions for the answer shown on the left (ranking: the left answer
    ranked above the second one).
    """
    judgments = Judgment.objects.filter(project=project).primary()
    if round_ is not None:
        judgments = judgments.filter(item__round=round_)
    n_flagged = judgments.flagged().count()
    if not include_flagged:
        judgments = judgments.unflagged()
    if project.task_kind == TaskKind.RANKING:
        rows = judgments.values_list("source", "ranking", "shown_choice")
        tallies = qc_metrics.ranking_distribution(rows.iterator(chunk_size=5000), k=project.k)
    else:
        tallies = qc_metrics.pairwise_distribution(
            judgments.values("source", "choice", "shown_choice")
            .annotate(n=Count("id"))
            .values_list("source", "choice", "shown_choice", "n")
            .order_by()
        )
    return {
        "project_id": project.pk,
        "round": round_.number if round_ is not None else None,
        "task_kind": project.task_kind,
        "n_flagged": n_flagged,
        "by_source": {source: tallies[source] for source in qc_metrics.sources_in_order(tallies)},
    }


# ---- annotator quality ---------------------------------------------------------------------


def _resumed_since(*, project: Project, annotator_ids: list[int] | None) -> dict[int, datetime]:
    resumed = AnnotatorAssessment.objects.filter(
        project=project, verdict=AnnotatorAssessment.Verdict.RESUMED
    )
    if annotator_ids is not None:
        resumed = resumed.filter(annotator_id__in=annotator_ids)
    return dict(
        resumed.values("annotator_id")
        .annotate(at=Max("created_at"))
        .values_list("annotator_id", "at")
    )


def annotator_checks_taken(
    *, project: Project, since: dict[int, datetime | None]
) -> dict[int, int]:
    """Return annotator id -> QC checks of them stored since their last resume (``since``).

    Counts the assessments a check wrote (pass or pause; not a researcher's manual pause or
    a resume): how many times the tests looked at this annotator, which the next check needs
    to spend its test levels (`evaluation.stats.quality.spent_level`). One query.
    """
    taken: dict[int, int] = dict.fromkeys(since, 0)
    rows = (
        AnnotatorAssessment.objects.filter(project=project, annotator_id__in=list(since))
        .filter(verdict__in=[AnnotatorAssessment.Verdict.PASS, AnnotatorAssessment.Verdict.PAUSE])
        .exclude(trigger=AnnotatorAssessment.Trigger.MANUAL)
        .values_list("annotator_id", "created_at")
    )
    for annotator_id, created_at in rows:
        start = since[annotator_id]
        if start is None or created_at > start:
            taken[annotator_id] += 1
    return taken


def after_last_resume(since: dict[int, datetime]) -> Q:
    """Return the filter leaving out judgments a rater made before their last resume."""
    condition = Q()
    for annotator_id, at in since.items():
        condition &= ~Q(annotator_id=annotator_id, created_at__lte=at)
    return condition


def _own_judgments_qs(
    *, project: Project, annotator_ids: list[int] | None, since: dict[int, datetime]
):
    """Return the annotators' judgments made since their last resume."""
    judgments = Judgment.objects.filter(project=project, annotator_id__isnull=False)
    if annotator_ids is not None:
        judgments = judgments.filter(annotator_id__in=annotator_ids)
    return judgments.filter(after_last_resume(since))


def _originals(rows: list[qc_metrics.OwnJudgment]) -> dict[int, object]:
    """Return original assignment id -> label for the repeats among the rows."""
    repeat_of = [row.repeat_of_id for row in rows if row.repeat_of_id is not None]
    return {
        assignment_id: label_of(choice, ranking)
        for assignment_id, choice, ranking in Judgment.objects.filter(
            assignment_id__in=repeat_of
        ).values_list("assignment_id", "choice", "ranking")
    }


def _item_chars(item_ids: list[int]) -> dict[int, int]:
    """Return item id -> characters of its prompt and answers."""
    chars = dict(
        Item.objects.filter(pk__in=item_ids)
        .annotate(n=Length("prompt__text"))
        .values_list("pk", "n")
    )
    for item_id, n in (
        ItemCandidate.objects.filter(item_id__in=item_ids)
        .values("item_id")
        .annotate(n=Sum(Length("candidate__text")))
        .values_list("item_id", "n")
    ):
        chars[item_id] = (chars.get(item_id) or 0) + (n or 0)
    return chars


def _item_among(item_ids: list[int]):
    """The condition that a judgment's item is one of `item_ids`: on PostgreSQL one array
    parameter (`= ANY`, tested by hashing), not one parameter per id for Django to prepare."""
    if connection.vendor != "postgresql":
        return Q(item_id__in=item_ids)
    column = f'"{Judgment._meta.db_table}"."{Judgment._meta.get_field("item").column}"'
    return RawSQL(f"{column} = ANY(%s)", (item_ids,), output_field=BooleanField())


def _crowd(
    *, project: Project, items, since: dict[int, datetime], policy: QualityPolicy
) -> qc_metrics.Crowd:
    """Return the crowd on these items (a list of item ids): everyone's primary, unflagged
    labels there."""
    rows = (
        Judgment.objects.filter(project=project)
        .filter(_item_among(items))
        .filter(after_last_resume(since))
        .without_repeats()
        .unflagged()
        .values_list(*qc_metrics.CROWD_FIELDS)
    )
    return qc_metrics.crowd_figures(map(qc_metrics.CrowdJudgment._make, rows), policy=policy)


def annotator_quality(
    *,
    project: Project,
    annotator_ids: list[int] | None = None,
    policy: QualityPolicy | None = None,
) -> dict[int, AnnotatorQuality]:
    """Return quality figures of annotators (all with judgments when ids are not given).

    Each annotator is judged on their judgments since their last resume: gold accuracy
    (`annotation.labels.gold_tallies`: pairwise the same choice, ranking the same best
    answer, repeats left out), self-agreement on planned repeats (repeat vs original, both
    canonical), position bias (share of left presses among A/B decisions), speed (too fast
    to read ``prompt + answers`` at the policy's reading speed, or under
    ``min_seconds_per_item``, or far below the pool of times on the same items; the server's
    time on task where measured, else the client's; machine accounts are not timed), skip
    rate (against the other human annotators served the same items) and agreement with the
    consensus of the other annotators of the same label source on shared items (QC-flagged
    labels of others left out). A handful of queries whatever the number of annotators.
    """
    policy = policy or quality_policy_get(project=project)
    since = _resumed_since(project=project, annotator_ids=annotator_ids)
    own = _own_judgments_qs(project=project, annotator_ids=annotator_ids, since=since)
    own_rows = list(
        map(qc_metrics.OwnJudgment._make, own.order_by("id").values_list(*qc_metrics.OWN_FIELDS))
    )
    if not own_rows:
        return {}
    originals = _originals(own_rows)
    # The items as a list of ids, which PostgreSQL tests by hashing them, whatever its
    # statistics say. As a subquery, planned on statistics from before the project had
    # judgments, it was joined by a nested loop over the project's judgments per own
    # judgment (100 ms at 500 judgments, growing with their square).
    items = sorted({row.item_id for row in own_rows})
    crowd = _crowd(project=project, items=items, since=since, policy=policy)
    rows_by_annotator: dict[int, list[qc_metrics.OwnJudgment]] = defaultdict(list)
    for row in own_rows:
        rows_by_annotator[row.annotator_id].append(row)
    # Text lengths and skip rates only for those whose speed and skips are judged.
    checked = [
        a for a, rows in rows_by_annotator.items() if qc_metrics.timed_and_skip_checked(rows)
    ]
    chars = _item_chars(sorted({row.item_id for a in checked for row in rows_by_annotator[a]}))
    skips = _skip_rates(project=project, annotator_ids=checked, since=since) if checked else {}
    return {
        annotator_id: qc_metrics.annotator_figures(
            rows,
            originals=originals,
            chars=chars,
            crowd=crowd,
            skips=skips.get(annotator_id),
            since=since.get(annotator_id),
            policy=policy,
        )
        for annotator_id, rows in rows_by_annotator.items()
    }


def _skip_rates(
    *, project: Project, annotator_ids: list[int], since: dict[int, datetime]
) -> dict[int, SkipRate]:
    """Return skip rates since the last resume against the other humans' on the same items.

    Two queries; their size grows with these annotators' work, not the project's.
    """
    finished = (Assignment.Status.SUBMITTED, Assignment.Status.SKIPPED)
    own = list(
        Assignment.objects.filter(
            project=project, annotator_id__in=annotator_ids, status__in=finished
        ).values_list("annotator_id", "item_id", "status", "finished_at")
    )
    all_items = {item_id for _, item_id, _, _ in own}
    machines = get_user_model().objects.filter(groups__name__in=list(SOURCE_GROUPS))
    pool = (
        Assignment.objects.filter(project=project, item_id__in=all_items, status__in=finished)
        .exclude(annotator__in=machines)
        .values("annotator_id", "item_id")
        .annotate(n=Count("id"), n_skipped=Count("id", filter=Q(status=Assignment.Status.SKIPPED)))
        .values_list("annotator_id", "item_id", "n", "n_skipped")
    )
    return qc_metrics.skip_rates(own=own, pool=pool, since=since, skipped=Assignment.Status.SKIPPED)


def _label_counts(*, project: Project) -> tuple[dict[int, Counter], Counter]:
    """Return user id -> labels per source, and user id -> labels QC flagged."""
    label_counts: dict[int, Counter] = defaultdict(Counter)
    flagged_counts: Counter = Counter()
    for annotator_id, source, n, n_flagged in (
        Judgment.objects.filter(project=project, annotator_id__isnull=False)
        .values("annotator_id", "source")
        .annotate(n=Count("id"), n_flagged=Count("id", filter=flagged_q()))
        .values_list("annotator_id", "source", "n", "n_flagged")
        .order_by()
    ):
        label_counts[annotator_id][source] += n
        flagged_counts[annotator_id] += n_flagged
    return label_counts, flagged_counts


def _latest_assessments(*, project: Project) -> dict[int, AnnotatorAssessment]:
    """Return user id -> their newest assessment that is not a resume."""
    latest_ids = (
        AnnotatorAssessment.objects.filter(project=project)
        .exclude(verdict=AnnotatorAssessment.Verdict.RESUMED)
        .values("annotator_id")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    return {a.annotator_id: a for a in AnnotatorAssessment.objects.filter(pk__in=latest_ids)}


def annotator_quality_table(*, project: Project) -> list[dict]:
    """Return one row per project member or labeller, with their latest stored QC assessment.

    Reads stored assessments (written by the QC check) instead of recomputing: five queries
    whatever the project size. Shape of a row::

        {"user_id", "username", "role", "status", "flagged", "status_reason",
         "judgment_count", "sources": {source: n labels}, "n_flagged_labels",
         "trust_weight" (Laplace-smoothed gold accuracy, 0.5 without gold answers),
         "assessment": None | {"id", "verdict", "applied", "failed_checks", "reasons", "notes",
                               "trigger", "created_at"},
         "metrics": {} | AnnotatorQuality.as_json() of that assessment,
         "resumed_at": iso time of the last resume or None}
    """
    memberships = {
        m.user_id: m
        for m in Membership.objects.filter(project=project).select_related("user").order_by("id")
    }
    label_counts, flagged_counts = _label_counts(project=project)
    latest = _latest_assessments(project=project)
    resumed = _resumed_since(project=project, annotator_ids=None)
    weights = annotator_trust_weights(project=project)
    user_ids = list(memberships) + sorted(set(label_counts) - set(memberships))
    names = dict(
        get_user_model()
        .objects.filter(pk__in=[u for u in user_ids if u not in memberships])
        .values_list("pk", "username")
    )
    rows = []
    for user_id in user_ids:
        membership = memberships.get(user_id)
        rows.append(
            qc_metrics.member_row(
                user_id,
                membership=membership,
                username=membership.user.username if membership else names.get(user_id, ""),
                sources=dict(label_counts.get(user_id, {})),
                n_flagged_labels=flagged_counts.get(user_id, 0),
                trust_weight=weights.get(user_id, DEFAULT_TRUST),
                assessment=latest.get(user_id),
                resumed_at=resumed.get(user_id),
            )
        )
    return rows


def annotator_assessments(*, project: Project, annotator_id: int, limit: int = 50) -> list:
    """Return an annotator's stored assessments in a project, newest first."""
    return list(
        AnnotatorAssessment.objects.filter(project=project, annotator_id=annotator_id).order_by(
            "-created_at", "-id"
        )[:limit]
    )


# ---- trust weights -------------------------------------------------------------------------


def annotator_trust_weights(*, project: Project) -> dict[int, float]:
    """Return user id -> trust weight: the exporter's Laplace-smoothed gold accuracy.

    Reuses `annotation.exports.gold_weights` (the weights of its ``trust_weighted``
    aggregation), keyed by user id; annotators without gold answers are absent (weight 0.5).
    It counts gold answers by the same rule as the QC check (`annotation.labels.gold_tallies`),
    over all of an annotator's labels where the check looks only since their last resume.
    """
    return {rater[1]: weight for rater, weight in gold_weights(project).items() if rater[0] == "u"}


# ---- disagreement queue --------------------------------------------------------------------


def disputed_item_ids(
    *,
    project: Project,
    policy: QualityPolicy | None = None,
    item_ids: Iterable[int] | None = None,
) -> dict[int, float]:
    """Return item id -> majority share for items split beyond the policy's threshold.

    `item_ids` limits it to those items: a list, or a query of ids (run as a subquery).

    Uses unflagged primary labels of the policy's review sources on non-gold items; items that
    already have an adjudication are left out.
    """
    policy = policy or quality_policy_get(project=project)
    judgments = (
        Judgment.objects.filter(project=project)
        .counted(policy.sources_for_review())
        .exclude(item__adjudications__isnull=False)
    )
    if item_ids is not None:
        judgments = judgments.filter(item_id__in=item_ids)
    labels: dict[int, list] = defaultdict(list)
    for item_id, choice, ranks in judgments.values_list("item_id", "choice", "ranking"):
        labels[item_id].append(choice or ranks)
    ranking = project.task_kind == TaskKind.RANKING
    return review.disputed_shares(labels, ranking=ranking, policy=policy)


def _review_items(items: list[Item], ranking: bool, sources: list[str]) -> list[dict]:
    """Return review payloads of items: answers in canonical order, every label, adjudications.

    The split shown is the one that queues an item: counted votes of the review sources.
    """
    ids = [item.pk for item in items]
    slots: dict[int, list[dict]] = defaultdict(list)
    for item_id, position, text in (
        ItemCandidate.objects.filter(item_id__in=ids)
        .order_by("item_id", "position")
        .values_list("item_id", "position", "candidate__text")
    ):
        slots[item_id].append({"position": position, "label": "ABCDEFGH"[position], "text": text})
    labels: dict[int, list[dict]] = defaultdict(list)
    counted: dict[int, list] = defaultdict(list)
    for row in (
        Judgment.objects.filter(item_id__in=ids)
        .order_by("item_id", "id")
        .values(*review.LABEL_FIELDS)
    ):
        if is_counted_row(row, sources):
            counted[row["item_id"]].append(row["choice"] or row["ranking"])
        labels[row["item_id"]].append(review.label_json(row))
    adjudications: dict[int, list[dict]] = defaultdict(list)
    for adjudication in (
        Adjudication.objects.filter(item_id__in=ids).select_related("reviewer").order_by("id")
    ):
        adjudications[adjudication.item_id].append(review.adjudication_payload(adjudication))
    return [
        review.review_payload(
            item,
            ranking=ranking,
            candidates=slots[item.pk],
            labels=labels[item.pk],
            counted=counted[item.pk],
            adjudications=adjudications[item.pk],
        )
        for item in items
    ]


def disagreement_queue(*, project: Project, limit: int = 100, offset: int = 0) -> dict:
    """Return the items waiting for review (``needs_review``), most split first.

    For reviewers only (the API checks the role): each entry shows every label with who gave
    it. Shape::

        {"project_id", "count", "limit", "offset",
         "results": [{"item_id", "round", "needs_review", "prompt": {"text", "messages"},
                      "candidates": [{"position", "label" ("A" = position 0), "text"}],
                      "majority_share", "n_votes", "vote_counts": {label: n},
                      "labels": [{"judgment_id", "annotator", "source", "choice", "ranking",
                                  "strength", "confidence", "rationale", "is_repeat",
                                  "qc_flag", "created_at"}],
                      "adjudications": [{"id", "item_id", "reviewer", "choice", "ranking",
                                         "note", "created_at"}]}]}

    Candidates carry no model names. Sorting by split needs the labels, so the queue is
    ordered in Python over the flagged items (a short list by construction), then sliced.
    """
    items = list(
        Item.objects.filter(project=project, needs_review=True)
        .select_related("prompt", "round")
        .order_by("id")
    )
    ranking = project.task_kind == TaskKind.RANKING
    policy = quality_policy_get(project=project)
    split = disputed_item_ids(project=project, policy=policy, item_ids=[item.pk for item in items])
    items.sort(key=lambda item: (split.get(item.pk, 1.0), item.pk))
    page = items[offset : offset + limit]
    return {
        "project_id": project.pk,
        "count": len(items),
        "limit": limit,
        "offset": offset,
        "results": _review_items(page, ranking, policy.sources_for_review()),
    }


def review_item(*, item: Item) -> dict:
    """Return one item's review payload (answers, all labels, adjudications)."""
    policy = quality_policy_get(project=item.project)
    ranking = item.project.task_kind == TaskKind.RANKING
    return _review_items([item], ranking, policy.sources_for_review())[0]
