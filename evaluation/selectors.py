"""Read-side QC queries: agreement, annotator quality, label distribution, disagreement queue.

The statistics come from the pure libraries (`evaluation.stats.agreement`,
`evaluation.stats.quality`); these functions load judgments in a few queries and shape them
into plain dicts for the API and the researcher dashboard. Every result is JSON-ready (NaN
becomes None).

Scope of the labels: agreement and label counts use primary labels, i.e. repeats (the same
annotator twice) and gold items are left out unless asked for, and labels flagged by QC are
left out unless ``include_flagged``. Label sources (human, ai, simulated, imported) are never
pooled: each is reported in its own block, and AI (or simulated) labels are compared with
human ones per round in ``cross_source``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.contrib.auth import get_user_model
from django.db.models import Count, Max, Q, Sum
from django.db.models.functions import Length

from annotation.exports import gold_weights
from annotation.labels import PAIRWISE_LABELS, label_of, label_text, shown_side, top_positions
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
from evaluation.models import AgreementReport, AnnotatorAssessment, QualityPolicy
from evaluation.stats.agreement import (
    BootstrapCI,
    bootstrap_ci,
    cohen_kappa,
    fleiss_kappa,
    kendall_tau_b,
    krippendorff_alpha,
    percent_agreement,
)
from evaluation.stats.quality import (
    ConsensusOutlier,
    GoldAccuracy,
    PositionBias,
    QualityThresholds,
    SkipRate,
    SpeedReport,
    Stability,
    consensus_outliers,
    gold_accuracy,
    intra_rater_stability,
    position_bias,
    skip_rate,
    speed_outliers,
)

# Machine accounts (simulated, AI) label in no human time: they are not speed-checked, and
# (never skipping) they are no part of anyone's skip-rate pool.
MACHINE_SOURCES = (LabelSource.SIMULATED, LabelSource.AI)

LABEL_CODE = {label: code for code, label in enumerate(PAIRWISE_LABELS)}
# Human labels first; every other source is reported beside them, never mixed in.
SOURCE_ORDER = (LabelSource.HUMAN, LabelSource.AI, LabelSource.SIMULATED, LabelSource.IMPORTED)
REFERENCE_SOURCE = LabelSource.HUMAN

Rater = int | str  # a user id, or "ext:<name>" for imported labels without an account


# ---- small helpers -------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """Return a float, or None for None and NaN (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def _ci(result: BootstrapCI | None) -> dict | None:
    """Return a bootstrap result as a JSON-ready dict."""
    if result is None:
        return None
    return {
        "estimate": _number(result.estimate),
        "low": _number(result.low),
        "high": _number(result.high),
        "n_valid": result.n_valid,
    }


def _mean_ci(values: Iterable[float], n_boot: int, seed: int, alpha: float = 0.05) -> dict | None:
    """Return the mean of per-item values with a percentile bootstrap interval over items.

    Resampling n items with replacement draws how often each distinct value occurs from
    Multinomial(n, observed shares): the same bootstrap as `bootstrap_ci(np.mean, ...)`, at
    the cost of the (few) distinct values instead of the items.
    """
    array = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if array.size == 0:
        return None
    distinct, counts = np.unique(array, return_counts=True)
    rng = np.random.default_rng(seed)
    means = rng.multinomial(array.size, counts / array.size, size=n_boot) @ distinct / array.size
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2]) if n_boot else (None, None)
    return {
        "estimate": _number(array.mean()),
        "low": _number(low),
        "high": _number(high),
        "n_valid": n_boot,
    }


def _rater_key(annotator_id: int | None, external: str) -> Rater:
    return annotator_id if annotator_id is not None else f"ext:{external or 'unknown'}"


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


def _modes(counts: Counter) -> set:
    top = max(counts.values())
    return {label for label, n in counts.items() if n == top}


def _sources_in_order(sources: Iterable[str]) -> list[str]:
    present = set(sources)
    ordered = [s for s in SOURCE_ORDER if s in present]
    return ordered + sorted(present - set(ordered))


# ---- policy --------------------------------------------------------------------------------


def quality_policy_get(*, project: Project) -> QualityPolicy:
    """Return the project's QC policy, or an unsaved one with the defaults."""
    policy = QualityPolicy.objects.filter(project=project).first()
    return policy if policy is not None else QualityPolicy(project=project)


def quality_thresholds(*, policy: QualityPolicy) -> QualityThresholds:
    """Return the library thresholds of a policy."""
    return QualityThresholds(
        min_gold_items=policy.min_gold_items,
        min_gold_accuracy=policy.min_gold_accuracy,
        confidence=policy.confidence,
        min_repeat_pairs=policy.min_repeat_pairs,
        min_stability=policy.min_stability,
        min_position_decisions=policy.min_position_decisions,
        position_alpha=policy.position_alpha,
        max_position_skew=policy.max_position_bias,
        min_timed_judgments=policy.min_timed_judgments,
        max_fast_share=policy.max_fast_share,
        min_skip_served=policy.min_served_for_skip_rate,
        max_skip_excess=policy.max_skip_excess,
        skip_alpha=policy.skip_alpha,
        min_consensus_votes=policy.min_consensus_votes,
        consensus_alpha=policy.consensus_alpha,
    )


# ---- agreement -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Vote:
    item_id: int
    rater: Rater
    source: str
    label: str | tuple[int, ...]
    round_number: int


def _votes(
    *, project: Project, round_: Round | None, include_gold: bool, include_flagged: bool
) -> list[_Vote]:
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
        _Vote(
            item_id, _rater_key(annotator_id, external), source, label_of(choice, ranking), number
        )
        for item_id, annotator_id, external, source, choice, ranking, number in rows
    ]


def _by_item(votes: Iterable[_Vote]) -> dict[int, dict[Rater, Any]]:
    """Group labels by item and rater; a rater's later label on an item replaces an earlier one."""
    grouped: dict[int, dict[Rater, Any]] = defaultdict(dict)
    for vote in votes:
        grouped[vote.item_id][vote.rater] = vote.label
    return grouped


def _compact_matrix(by_item: dict[int, dict[Rater, Any]], code: Callable[[Any], Any]) -> np.ndarray:
    """Return a (max labels per item) x items x ... matrix of codes, NaN where empty.

    Krippendorff's alpha and percent agreement depend only on how many labels of each value a
    unit got, not on who gave them, so row r simply holds each item's r-th label: the matrix
    is as tall as the overlap instead of the number of annotators.
    """
    items = list(by_item)
    height = max(len(labels) for labels in by_item.values())
    first = code(next(iter(by_item[items[0]].values())))
    shape = (height, len(items), *np.shape(first))
    matrix = np.full(shape, np.nan)
    for column, item in enumerate(items):
        for row, label in enumerate(by_item[item].values()):
            matrix[row, column] = code(label)
    return matrix


def _kappa_ci(
    codes_a: np.ndarray, codes_b: np.ndarray, n_boot: int, seed: int, alpha: float = 0.05
) -> tuple[float, float]:
    """Return a percentile bootstrap interval of Cohen's kappa over the shared items.

    Resampling n items with replacement draws the pair table from Multinomial(n, observed
    cell shares), so all replicates come from one vectorised draw.
    """
    n_values = len(PAIRWISE_LABELS)
    n = codes_a.size
    table = np.bincount(codes_a * n_values + codes_b, minlength=n_values * n_values)
    rng = np.random.default_rng(seed)
    shares = rng.multinomial(n, table / n, size=n_boot).reshape(n_boot, n_values, n_values) / n
    observed = np.trace(shares, axis1=1, axis2=2)
    expected = (shares.sum(axis=2) * shares.sum(axis=1)).sum(axis=1)
    # kappa = (p_o - p_e) / (1 - p_e)  (Cohen 1960), as evaluation.stats.agreement.cohen_kappa
    with np.errstate(divide="ignore", invalid="ignore"):
        kappas = np.where(expected < 1, (observed - expected) / (1 - expected), np.nan)
    kappas = kappas[~np.isnan(kappas)]
    if kappas.size == 0:
        return float("nan"), float("nan")
    low, high = np.quantile(kappas, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def _pair_table(
    by_rater: dict[Rater, dict[int, Any]],
    names: dict[Rater, str],
    min_shared_items: int,
    pair_stat: Callable[[list, list], dict],
) -> dict:
    """Return the annotator x annotator matrix of a pairwise statistic on shared items."""
    raters = sorted(by_rater, key=lambda r: (names.get(r, str(r)), str(r)))
    size = len(raters)
    matrix: list[list[float | None]] = [[None] * size for _ in range(size)]
    shared_counts = [[0] * size for _ in range(size)]
    pairs = []
    for i in range(size):
        shared_counts[i][i] = len(by_rater[raters[i]])
        for j in range(i + 1, size):
            labels_a, labels_b = by_rater[raters[i]], by_rater[raters[j]]
            shared = sorted(labels_a.keys() & labels_b.keys())
            shared_counts[i][j] = shared_counts[j][i] = len(shared)
            if len(shared) < max(min_shared_items, 1):
                continue
            stat = pair_stat([labels_a[k] for k in shared], [labels_b[k] for k in shared])
            matrix[i][j] = matrix[j][i] = stat["estimate"]
            pairs.append({"a": raters[i], "b": raters[j], "n_shared": len(shared), **stat})
    return {
        "min_shared_items": min_shared_items,
        "annotators": [{"id": r, "name": names.get(r, str(r))} for r in raters],
        "matrix": matrix,
        "n_shared": shared_counts,
        "pairs": pairs,
    }


def _pairwise_block(
    by_item: dict[int, dict[Rater, str]],
    names: dict[Rater, str],
    *,
    overlap: int,
    n_boot: int,
    seed: int,
    min_shared_items: int,
) -> dict:
    """Return nominal agreement figures of pairwise labels from one source."""
    units = {item: labels for item, labels in by_item.items() if len(labels) >= 2}
    block: dict[str, Any] = {
        "level": "nominal",
        "labels": list(PAIRWISE_LABELS),
        "n_items": len(units),
        "n_judgments": sum(len(labels) for labels in by_item.values()),
        "n_annotators": len({r for labels in by_item.values() for r in labels}),
        "alpha": None,
        "percent_agreement": None,
        "fleiss_kappa": None,
    }
    if units:
        matrix = _compact_matrix(units, LABEL_CODE.__getitem__)
        block["alpha"] = _ci(
            bootstrap_ci(
                lambda m: krippendorff_alpha(m, "nominal"), matrix, n_boot, seed=seed, axis=1
            )
        )
        block["percent_agreement"] = _ci(
            bootstrap_ci(percent_agreement, matrix, n_boot, seed=seed, axis=1)
        )
        block["fleiss_kappa"] = _fleiss_block(units, overlap=overlap, n_boot=n_boot, seed=seed)

    by_rater: dict[Rater, dict[int, str]] = defaultdict(dict)
    for item, labels in by_item.items():
        for rater, label in labels.items():
            by_rater[rater][item] = label

    def kappa_stat(labels_a: list, labels_b: list) -> dict:
        estimate = cohen_kappa(labels_a, labels_b, categories=PAIRWISE_LABELS)
        codes_a = np.fromiter((LABEL_CODE[x] for x in labels_a), dtype=np.int64)
        codes_b = np.fromiter((LABEL_CODE[x] for x in labels_b), dtype=np.int64)
        low, high = _kappa_ci(codes_a, codes_b, n_boot, seed)
        return {"estimate": _number(estimate), "low": _number(low), "high": _number(high)}

    block["pairwise"] = {
        "metric": "cohen_kappa",
        **_pair_table(by_rater, names, min_shared_items, kappa_stat),
    }
    block["leave_one_out"] = _leave_one_out(
        by_rater, by_item, names, credit=_mode_credit, n_boot=n_boot, seed=seed
    )
    return block


def _fleiss_block(
    units: dict[int, dict[Rater, str]], *, overlap: int, n_boot: int, seed: int
) -> dict | None:
    """Return Fleiss' kappa over the items with the full overlap (equal raters per item)."""
    sizes = Counter(len(labels) for labels in units.values())
    n_raters = overlap if sizes.get(overlap, 0) >= 2 else sizes.most_common(1)[0][0]
    rows = [labels for labels in units.values() if len(labels) == n_raters]
    if len(rows) < 2 or n_raters < 2:
        return None
    table = np.zeros((len(rows), len(PAIRWISE_LABELS)))
    for row, labels in enumerate(rows):
        for label in labels.values():
            table[row, LABEL_CODE[label]] += 1
    result = _ci(bootstrap_ci(fleiss_kappa, table, n_boot, seed=seed))
    return {**result, "n_items": len(rows), "n_raters": n_raters}


def _mode_credit(label: str, others: list[str]) -> float:
    """Return 1 if the label is the others' unique mode, 1/m when it is one of m tied modes."""
    modes = _modes(Counter(others))
    return 1.0 / len(modes) if label in modes else 0.0


def _rank_credit(ranks: tuple[int, ...], others: list[tuple[int, ...]]) -> float:
    """Return Kendall's tau-b between a ranking and the others' mean ranks."""
    return kendall_tau_b(ranks, np.mean(np.asarray(others, dtype=float), axis=0))


def _leave_one_out(
    by_rater: dict[Rater, dict[int, Any]],
    by_item: dict[int, dict[Rater, Any]],
    names: dict[Rater, str],
    *,
    credit: Callable[[Any, list], float],
    n_boot: int,
    seed: int,
) -> list[dict]:
    """Return each annotator's agreement with the consensus of the others on the same items."""
    rows = []
    for rater, labels in by_rater.items():
        credits = []
        for item, label in labels.items():
            others = [other for r, other in by_item[item].items() if r != rater]
            if others:
                credits.append(credit(label, others))
        result = _mean_ci(credits, n_boot, seed)
        rows.append(
            {
                "annotator_id": rater,
                "name": names.get(rater, str(rater)),
                "n_items": sum(not math.isnan(c) for c in credits),
                "agreement": result,
            }
        )
    rows.sort(key=lambda row: (row["name"], str(row["annotator_id"])))
    return rows


def _ranking_block(
    by_item: dict[int, dict[Rater, tuple[int, ...]]],
    names: dict[Rater, str],
    *,
    k: int,
    n_boot: int,
    seed: int,
    min_shared_items: int,
) -> dict:
    """Return ordinal agreement figures of K-way rankings from one source."""
    by_item = {
        item: {r: ranks for r, ranks in labels.items() if len(ranks) == k}
        for item, labels in by_item.items()
    }
    units = {item: labels for item, labels in by_item.items() if len(labels) >= 2}
    block: dict[str, Any] = {
        "level": "ordinal",
        "labels": list(range(1, k + 1)),
        "n_items": len(units),
        "n_judgments": sum(len(labels) for labels in by_item.values()),
        "n_annotators": len({r for labels in by_item.values() for r in labels}),
        "alpha": None,
        "percent_agreement": None,
        "fleiss_kappa": None,
        "kendall_tau": None,
    }
    if units:
        # Units are (item, candidate position); resampling keeps an item's positions together.
        matrix = _compact_matrix(units, lambda ranks: np.asarray(ranks, dtype=float))

        def ordinal_alpha(m: np.ndarray) -> float:
            return krippendorff_alpha(m.reshape(m.shape[0], -1), "ordinal")

        block["alpha"] = _ci(bootstrap_ci(ordinal_alpha, matrix, n_boot, seed=seed, axis=1))
        # Mean tau-b over all rater pairs of all items, as mean_pairwise_kendall_tau.
        sums = []
        for labels in units.values():
            rankings = list(labels.values())
            taus = [
                kendall_tau_b(rankings[i], rankings[j])
                for i in range(len(rankings))
                for j in range(i + 1, len(rankings))
            ]
            taus = [t for t in taus if not math.isnan(t)]
            if taus:
                sums.append((sum(taus), len(taus)))
        if sums:
            totals = np.asarray(sums, dtype=float)
            block["kendall_tau"] = _ci(
                bootstrap_ci(lambda a: a[:, 0].sum() / a[:, 1].sum(), totals, n_boot, seed=seed)
            )

    by_rater: dict[Rater, dict[int, tuple[int, ...]]] = defaultdict(dict)
    for item, labels in by_item.items():
        for rater, ranks in labels.items():
            by_rater[rater][item] = ranks

    def tau_stat(labels_a: list, labels_b: list) -> dict:
        taus = [kendall_tau_b(a, b) for a, b in zip(labels_a, labels_b, strict=True)]
        result = _mean_ci(taus, n_boot, seed) or {"estimate": None, "low": None, "high": None}
        return {key: result[key] for key in ("estimate", "low", "high")}

    block["pairwise"] = {
        "metric": "kendall_tau_b",
        **_pair_table(by_rater, names, min_shared_items, tau_stat),
    }
    block["leave_one_out"] = _leave_one_out(
        by_rater, by_item, names, credit=_rank_credit, n_boot=n_boot, seed=seed
    )
    return block


def _cross_source(votes: list[_Vote], *, ranking: bool, n_boot: int, seed: int) -> list[dict]:
    """Return, per round, how often each non-human source agrees with the human labels."""
    human: dict[tuple[int, int], list] = defaultdict(list)
    for vote in votes:
        if vote.source == REFERENCE_SOURCE:
            human[(vote.round_number, vote.item_id)].append(vote.label)
    if not human:
        return []
    compared: dict[tuple[int, str], list[tuple[Any, list]]] = defaultdict(list)
    for vote in votes:
        if vote.source != REFERENCE_SOURCE and (vote.round_number, vote.item_id) in human:
            reference = human[(vote.round_number, vote.item_id)]
            compared[(vote.round_number, vote.source)].append((vote.label, reference))
    out = []
    for (round_number, source), rows in sorted(compared.items()):
        entry: dict[str, Any] = {
            "round": round_number,
            "source": source,
            "reference": REFERENCE_SOURCE,
            "n_items": len(rows),
        }
        if ranking:
            entry["metric"] = "kendall_tau_b"
            entry["agreement"] = _mean_ci(
                [_rank_credit(label, reference) for label, reference in rows], n_boot, seed
            )
            entry["kappa"] = None
        else:
            entry["metric"] = "consensus_agreement"
            entry["agreement"] = _mean_ci(
                [_mode_credit(label, reference) for label, reference in rows], n_boot, seed
            )
            # Kappa against the human majority where the humans have a unique mode.
            decided = []
            for label, reference in rows:
                modes = _modes(Counter(reference))
                if len(modes) == 1:
                    decided.append((label, modes.pop()))
            entry["n_decided"] = len(decided)
            entry["kappa"] = (
                _number(
                    cohen_kappa(
                        [d[0] for d in decided],
                        [d[1] for d in decided],
                        categories=PAIRWISE_LABELS,
                    )
                )
                if decided
                else None
            )
        out.append(entry)
    return out


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
        votes = [v for v in votes if v.label in LABEL_CODE]
    names = _rater_names({vote.rater for vote in votes})
    sources = _sources_in_order(vote.source for vote in votes)
    by_source = {}
    for source in sources:
        by_item = _by_item(vote for vote in votes if vote.source == source)
        if ranking:
            by_source[source] = _ranking_block(
                by_item,
                names,
                k=project.k,
                n_boot=n_boot,
                seed=seed,
                min_shared_items=min_shared_items,
            )
        else:
            by_source[source] = _pairwise_block(
                by_item,
                names,
                overlap=project.overlap,
                n_boot=n_boot,
                seed=seed,
                min_shared_items=min_shared_items,
            )
    return {
        "project_id": project.pk,
        "round": round_.number if round_ is not None else None,
        "task_kind": project.task_kind,
        "n_boot": n_boot,
        "seed": seed,
        "sources": sources,
        "by_source": by_source,
        "cross_source": _cross_source(votes, ranking=ranking, n_boot=n_boot, seed=seed),
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
    ranking = project.task_kind == TaskKind.RANKING
    by_source: dict[str, dict] = {}
    if not ranking:
        rows = (
            judgments.values("source", "choice", "shown_choice")
            .annotate(n=Count("id"))
            .values_list("source", "choice", "shown_choice", "n")
            .order_by()
        )
        counts: dict[str, Counter] = defaultdict(Counter)
        sides: dict[str, Counter] = defaultdict(Counter)
        for source, choice, shown, n in rows:
            counts[source][choice] += n
            if shown in ("A", "B"):
                sides[source]["left" if shown == "A" else "right"] += n
        for source in _sources_in_order(counts):
            total = sum(counts[source].values())
            by_source[source] = {
                "n": total,
                "counts": {label: counts[source][label] for label in PAIRWISE_LABELS},
                "shares": {
                    label: counts[source][label] / total if total else None
                    for label in PAIRWISE_LABELS
                },
                **_sides(sides[source]),
            }
    else:
        rank_counts: dict[str, np.ndarray] = {}
        sides = defaultdict(Counter)
        totals: Counter = Counter()
        rows = judgments.values_list("source", "ranking", "shown_choice")
        for source, ranks, shown in rows.iterator(chunk_size=5000):
            if not ranks or len(ranks) != project.k:
                continue
            table = rank_counts.setdefault(source, np.zeros((project.k, project.k), dtype=int))
            table[np.arange(project.k), np.asarray(ranks) - 1] += 1
            totals[source] += 1
            side = shown_side(shown)
            if side:
                sides[source][side] += 1
        for source in _sources_in_order(rank_counts):
            by_source[source] = {
                "n": totals[source],
                "rank_counts": rank_counts[source].tolist(),
                **_sides(sides[source]),
            }
    return {
        "project_id": project.pk,
        "round": round_.number if round_ is not None else None,
        "task_kind": project.task_kind,
        "n_flagged": n_flagged,
        "by_source": by_source,
    }


def _sides(counter: Counter) -> dict:
    left, right = counter["left"], counter["right"]
    return {
        "left": left,
        "right": right,
        "left_share": left / (left + right) if left + right else None,
    }


# ---- annotator quality ---------------------------------------------------------------------


@dataclass(frozen=True)
class AnnotatorQuality:
    """Quality figures of one annotator's judgments since their last resume."""

    annotator_id: int
    source: str
    n_judgments: int
    since: datetime | None
    gold: GoldAccuracy
    stability: Stability
    position: PositionBias
    speed: SpeedReport | None
    consensus: ConsensusOutlier | None
    judgment_ids: tuple[int, ...]
    skips: SkipRate | None = None

    def as_json(self) -> dict:
        """Return the figures as the JSON stored on an assessment."""
        return {
            "source": self.source,
            "n_judgments": self.n_judgments,
            "since": self.since.isoformat() if self.since else None,
            "gold": {
                "n_items": self.gold.n_items,
                "n_correct": self.gold.n_correct,
                "accuracy": _number(
                    self.gold.n_correct / self.gold.n_items if self.gold.n_items else None
                ),
                "wilson_low": _number(self.gold.wilson_low),
                "judged": self.gold.judged,
            },
            "stability": {
                "n_pairs": self.stability.n_pairs,
                "agreement": _number(self.stability.agreement),
                "kappa": _number(self.stability.kappa),
            },
            "position": {
                "n_decisions": self.position.n_decisions,
                "n_left": self.position.n_left,
                "left_share": _number(self.position.left_share),
                "p_value": _number(self.position.p_value),
            },
            "speed": None
            if self.speed is None
            else {
                "n_timed": int(self.speed.flagged.size),
                "n_too_fast_to_read": int(self.speed.too_fast_to_read.sum()),
                "n_below_pool": int(self.speed.below_pool.sum()),
                "share_flagged": _number(self.speed.share_flagged),
                "pool_threshold_seconds": _number(self.speed.pool_threshold_seconds),
            },
            "skips": None
            if self.skips is None
            else {
                "n_served": self.skips.n_served,
                "n_skipped": self.skips.n_skipped,
                "rate": _number(self.skips.rate),
                "pool_rate": _number(self.skips.pool_rate),
                "p_value": _number(self.skips.p_value),
            },
            "consensus": None
            if self.consensus is None
            else {
                "n_votes": self.consensus.n_votes,
                "n_agree": self.consensus.n_agree,
                "expected_agree": _number(self.consensus.expected_agree),
                "p_value": _number(self.consensus.p_value),
            },
        }


def _gold_key(label: str | tuple[int, ...], gold: Any) -> tuple[Any, Any]:
    """Return (answer, gold) in comparable terms: choices as is, rankings by their best answer."""
    if isinstance(label, str):
        return label, gold
    if not isinstance(gold, list):
        return top_positions(label), None
    return top_positions(label), top_positions(tuple(gold))


def _consensus_label(label: str | tuple[int, ...]) -> str:
    """Return the label compared with the crowd: the choice, or a ranking's best answer."""
    return label if isinstance(label, str) else top_positions(label)


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


def annotator_quality(
    *,
    project: Project,
    annotator_ids: list[int] | None = None,
    policy: QualityPolicy | None = None,
) -> dict[int, AnnotatorQuality]:
    """Return quality figures of annotators (all with judgments when ids are not given).

    Each annotator is judged on their judgments since their last resume: gold accuracy on
    gold items (pairwise: same choice; ranking: same best answer), self-agreement on planned
    repeats (repeat vs original, both canonical), position bias (share of left presses among
    A/B decisions), speed (too fast to read ``prompt + answers`` at the policy's reading
    speed, or under ``min_seconds_per_item``, or far below the pool of times on the same
    items; the server's time on task where measured, else the client's; machine accounts
    are not timed), skip rate (against the other human annotators served the same items)
    and agreement with the consensus of the other annotators of the same label source on
    shared items (QC-flagged labels of others left out). A handful of queries whatever the
    number of annotators.
    """
    policy = policy or quality_policy_get(project=project)
    since = _resumed_since(project=project, annotator_ids=annotator_ids)
    own_qs = Judgment.objects.filter(project=project, annotator_id__isnull=False)
    if annotator_ids is not None:
        own_qs = own_qs.filter(annotator_id__in=annotator_ids)
    own_rows = list(
        own_qs.order_by("id").values_list(
            "id",
            "annotator_id",
            "item_id",
            "choice",
            "ranking",
            "shown_choice",
            "time_spent_ms",
            "source",
            "is_repeat",
            "assignment__repeat_of_id",
            "item__is_gold",
            "item__gold_answer",
            "created_at",
            "server_time_ms",
        )
    )
    own_rows = [row for row in own_rows if row[1] not in since or row[12] > since[row[1]]]
    if not own_rows:
        return {}
    item_ids = sorted({row[2] for row in own_rows})

    originals = {
        assignment_id: label_of(choice, ranking)
        for assignment_id, choice, ranking in Judgment.objects.filter(
            assignment_id__in=[row[9] for row in own_rows if row[9] is not None]
        ).values_list("assignment_id", "choice", "ranking")
    }
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

    # Everyone's primary labels on these items: the crowd for the consensus and speed pool.
    # Labels QC flagged (e.g. of a paused annotator) are no part of anyone's crowd.
    shared_rows = (
        Judgment.objects.filter(project=project, item_id__in=item_ids)
        .without_repeats()
        .unflagged()
        .values_list(
            "annotator_id",
            "external_rater",
            "item_id",
            "choice",
            "ranking",
            "source",
            "time_spent_ms",
            "created_at",
            "server_time_ms",
        )
    )
    crowd: dict[str, list[tuple[Rater, int, str]]] = defaultdict(list)
    pool_seconds: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (
        annotator_id,
        external,
        item_id,
        choice,
        ranking,
        source,
        ms,
        created,
        server_ms,
    ) in shared_rows:
        ms = server_ms if server_ms is not None else ms
        if annotator_id in since and created <= since[annotator_id]:
            continue
        rater = _rater_key(annotator_id, external)
        crowd[source].append((rater, item_id, _consensus_label(label_of(choice, ranking))))
        if ms:
            pool_seconds[(source, item_id)].append(ms / 1000)
    consensus = {
        source: consensus_outliers(
            votes, alpha=policy.consensus_alpha, min_votes=policy.min_consensus_votes
        )
        for source, votes in crowd.items()
    }

    rows_by_annotator: dict[int, list[tuple]] = defaultdict(list)
    for row in own_rows:
        rows_by_annotator[row[1]].append(row)
    skips = _skip_rates(project=project, annotator_ids=list(rows_by_annotator), since=since)
    floor_chars = policy.min_seconds_per_item * policy.reading_chars_per_second
    results = {}
    for annotator_id, rows in rows_by_annotator.items():
        source = Counter(row[7] for row in rows).most_common(1)[0][0]
        answers, golds, pairs, sides = [], [], [], []
        seconds, lengths, pool = [], [], []
        for row in rows:
            label = label_of(row[3], row[4])
            if row[10] and row[11] is not None and not row[8]:
                answer, gold = _gold_key(label, row[11])
                answers.append(answer)
                golds.append(gold)
            if row[8] and row[9] in originals:
                pairs.append((label_text(originals[row[9]]), label_text(label)))
            side = shown_side(row[5])
            if side:
                sides.append(side)
            # The server's figure first: a client that leaves out its own cannot dodge this.
            ms = row[13] if row[13] is not None else row[6]
            if ms is not None:
                seconds.append(ms / 1000)
                # A floor of min_seconds_per_item: as if the text were at least that long.
                lengths.append(max(chars.get(row[2]) or 0, floor_chars))
                pool.extend(pool_seconds.get((source, row[2]), ()))
        results[annotator_id] = AnnotatorQuality(
            annotator_id=annotator_id,
            source=source,
            n_judgments=len(rows),
            since=since.get(annotator_id),
            gold=gold_accuracy(answers, golds, min_items=policy.min_gold_items),
            stability=intra_rater_stability(pairs),
            position=position_bias(sides),
            speed=None
            if source in MACHINE_SOURCES
            else speed_outliers(
                seconds,
                lengths,
                reading_chars_per_second=policy.reading_chars_per_second,
                pool_seconds=pool or None,
            ),
            consensus=consensus.get(source, {}).get(annotator_id),
            judgment_ids=tuple(row[0] for row in rows),
            skips=None if source in MACHINE_SOURCES else skips.get(annotator_id),
        )
    return results


def _skip_rates(
    *, project: Project, annotator_ids: list[int], since: dict[int, datetime]
) -> dict[int, SkipRate]:
    """Return each annotator's skip rate since their last resume against the pool's on the
    same items: the other annotators' (machine accounts left out) served and skipped there.

    Two queries; their size grows with these annotators' work, not the project's.
    """
    finished = (Assignment.Status.SUBMITTED, Assignment.Status.SKIPPED)
    own = Assignment.objects.filter(
        project=project, annotator_id__in=annotator_ids, status__in=finished
    ).values_list("annotator_id", "item_id", "status", "finished_at")
    served: dict[int, Counter] = defaultdict(Counter)
    items_of: dict[int, set[int]] = defaultdict(set)
    for annotator_id, item_id, status, finished_at in own:
        if annotator_id in since and finished_at is not None and finished_at <= since[annotator_id]:
            continue
        served[annotator_id][status] += 1
        items_of[annotator_id].add(item_id)
    all_items = set().union(*items_of.values()) if items_of else set()
    machines = get_user_model().objects.filter(groups__name__in=list(SOURCE_GROUPS))
    pool_rows = (
        Assignment.objects.filter(project=project, item_id__in=all_items, status__in=finished)
        .exclude(annotator__in=machines)
        .values("annotator_id", "item_id")
        .annotate(n=Count("id"), n_skipped=Count("id", filter=Q(status=Assignment.Status.SKIPPED)))
        .values_list("annotator_id", "item_id", "n", "n_skipped")
    )
    per_item: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for annotator_id, item_id, n, n_skipped in pool_rows:
        per_item[item_id].append((annotator_id, n, n_skipped))
    rates = {}
    for annotator_id, counts in served.items():
        pool_served = pool_skipped = 0
        for item_id in items_of[annotator_id]:
            for other, n, n_skipped in per_item.get(item_id, ()):
                if other != annotator_id:
                    pool_served += n
                    pool_skipped += n_skipped
        rates[annotator_id] = skip_rate(
            counts[Assignment.Status.SKIPPED],
            sum(counts.values()),
            pool_skipped=pool_skipped,
            pool_served=pool_served,
        )
    return rates


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
    latest_ids = (
        AnnotatorAssessment.objects.filter(project=project)
        .exclude(verdict=AnnotatorAssessment.Verdict.RESUMED)
        .values("annotator_id")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    latest = {a.annotator_id: a for a in AnnotatorAssessment.objects.filter(pk__in=latest_ids)}
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
        assessment = latest.get(user_id)
        rows.append(
            {
                "user_id": user_id,
                "username": membership.user.username if membership else names.get(user_id, ""),
                "role": membership.role if membership else None,
                "status": membership.status if membership else None,
                "flagged": membership.flagged if membership else False,
                "status_reason": membership.status_reason if membership else "",
                "judgment_count": membership.judgment_count if membership else 0,
                "sources": dict(label_counts.get(user_id, {})),
                "n_flagged_labels": flagged_counts.get(user_id, 0),
                "trust_weight": weights.get(user_id, DEFAULT_TRUST),
                "assessment": None
                if assessment is None
                else {
                    "id": assessment.pk,
                    "verdict": assessment.verdict,
                    "applied": assessment.applied,
                    "failed_checks": assessment.failed_checks,
                    "reasons": assessment.reasons,
                    "notes": assessment.notes,
                    "trigger": assessment.trigger,
                    "created_at": assessment.created_at.isoformat(),
                },
                "metrics": assessment.metrics if assessment else {},
                "resumed_at": resumed[user_id].isoformat() if user_id in resumed else None,
            }
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

DEFAULT_TRUST = 0.5  # (0 + 1) / (0 + 2): no gold answers yet


def annotator_trust_weights(*, project: Project) -> dict[int, float]:
    """Return user id -> trust weight: the exporter's Laplace-smoothed gold accuracy.

    Reuses `annotation.exports.gold_weights` (the weights of its ``trust_weighted``
    aggregation), keyed by user id; annotators without gold answers are absent (weight 0.5).
    """
    return {rater[1]: weight for rater, weight in gold_weights(project).items() if rater[0] == "u"}


# ---- disagreement queue --------------------------------------------------------------------


def item_split(labels: list, *, ranking: bool) -> tuple[float | None, int]:
    """Return (majority share, votes counted) of an item's labels.

    Pairwise: the larger of A and B over the A/B votes (tie and both-bad do not count).
    Ranking: the share of rankings that put the most often top-ranked answer first.
    """
    if ranking:
        tops = Counter(top_positions(tuple(ranks)) for ranks in labels)
        n = sum(tops.values())
        return (max(tops.values()) / n if n else None), n
    counts = Counter(label for label in labels if label in ("A", "B"))
    n = counts["A"] + counts["B"]
    return (max(counts["A"], counts["B"]) / n if n else None), n


def disputed_item_ids(
    *, project: Project, policy: QualityPolicy | None = None, item_ids: list[int] | None = None
) -> dict[int, float]:
    """Return item id -> majority share for items split beyond the policy's threshold.

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
    disputed = {}
    for item_id, item_labels in labels.items():
        share, n = item_split(item_labels, ranking=ranking)
        if (
            share is not None
            and n >= policy.disagreement_min_votes
            and share < policy.disagreement_threshold - 1e-9
        ):
            disputed[item_id] = share
    return disputed


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
        .values(
            "id",
            "item_id",
            "annotator__username",
            "external_rater",
            "source",
            "choice",
            "ranking",
            "strength",
            "confidence",
            "rationale",
            "is_repeat",
            "is_gold",
            "item__is_gold",
            "qc_flag",
            "created_at",
        )
    ):
        if is_counted_row(row, sources):
            counted[row["item_id"]].append(row["choice"] or row["ranking"])
        labels[row["item_id"]].append(
            {
                "judgment_id": row["id"],
                "annotator": row["annotator__username"] or row["external_rater"],
                "source": row["source"],
                "choice": row["choice"] or None,
                "ranking": row["ranking"],
                "strength": row["strength"],
                "confidence": row["confidence"],
                "rationale": row["rationale"],
                "is_repeat": row["is_repeat"],
                "qc_flag": row["qc_flag"],
                "created_at": row["created_at"].isoformat(),
            }
        )
    adjudications: dict[int, list[dict]] = defaultdict(list)
    for adjudication in (
        Adjudication.objects.filter(item_id__in=ids).select_related("reviewer").order_by("id")
    ):
        adjudications[adjudication.item_id].append(adjudication_payload(adjudication))
    out = []
    for item in items:
        share, n = item_split(counted[item.pk], ranking=ranking)
        out.append(
            {
                "item_id": item.pk,
                "round": item.round.number,
                "needs_review": item.needs_review,
                "prompt": {"text": item.prompt.text, "messages": item.prompt.messages},
                "candidates": slots[item.pk],
                "majority_share": _number(share),
                "n_votes": n,
                "vote_counts": _vote_counts(counted[item.pk]),
                "labels": labels[item.pk],
                "adjudications": adjudications[item.pk],
            }
        )
    return out


def _vote_counts(labels: list) -> dict[str, int]:
    """Count labels by their text form ("A", or "1,2,3" for a ranking)."""
    return dict(
        Counter(label if isinstance(label, str) else label_text(tuple(label)) for label in labels)
    )


def adjudication_payload(adjudication: Adjudication) -> dict:
    """Return an adjudication as JSON."""
    return {
        "id": adjudication.pk,
        "item_id": adjudication.item_id,
        "reviewer": adjudication.reviewer.username,
        "choice": adjudication.choice or None,
        "ranking": adjudication.ranking,
        "note": adjudication.note,
        "created_at": adjudication.created_at.isoformat(),
    }


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
