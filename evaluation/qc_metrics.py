"""Quality-control figures from loaded judgment rows: per-annotator checks and label tallies.

`evaluation.selectors` runs the queries and hands the rows here; the statistics themselves
are the pure ones in `evaluation.stats.quality`. Nothing here touches the database.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from annotation.labels import (
    PAIRWISE_LABELS,
    gold_tallies,
    label_of,
    label_text,
    shown_side,
    top_positions,
)
from annotation.models import LabelSource
from evaluation.stats.jsonable import number
from evaluation.stats.quality import (
    ConsensusOutlier,
    GoldAccuracy,
    PositionBias,
    QualityThresholds,
    SkipRate,
    SpeedReport,
    Stability,
    consensus_outliers,
    gold_accuracy_of_tally,
    intra_rater_stability,
    position_bias,
    skip_rate,
    speed_outliers,
)

if TYPE_CHECKING:
    from annotation.models import Membership
    from evaluation.models import AnnotatorAssessment, QualityPolicy

# Machine accounts (simulated, AI) label in no human time: they are not speed-checked, and
# (never skipping) they are no part of anyone's skip-rate pool.
MACHINE_SOURCES = (LabelSource.SIMULATED, LabelSource.AI)

# Human labels first; every other source is reported beside them, never mixed in.
SOURCE_ORDER = (LabelSource.HUMAN, LabelSource.AI, LabelSource.SIMULATED, LabelSource.IMPORTED)

Rater = int | str  # a user id, or "ext:<name>" for imported labels without an account


def sources_in_order(sources: Iterable[str]) -> list[str]:
    """Return the sources present in report order: known ones first, then by name."""
    present = set(sources)
    ordered = [s for s in SOURCE_ORDER if s in present]
    return ordered + sorted(present - set(ordered))


def rater_key(annotator_id: int | None, external: str) -> Rater:
    """Return the key of a label's rater: the user id, else the external name."""
    return annotator_id if annotator_id is not None else f"ext:{external or 'unknown'}"


class OwnJudgment(NamedTuple):
    """One of the checked annotator's judgments, as `OWN_FIELDS` loads it."""

    id: int
    annotator_id: int
    item_id: int
    choice: str
    ranking: list[int] | None
    shown_choice: str
    time_spent_ms: int | None
    source: str
    is_repeat: bool
    repeat_of_id: int | None
    item_is_gold: bool
    gold_answer: Any
    server_time_ms: int | None


OWN_FIELDS = (
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
    "server_time_ms",
)


class CrowdJudgment(NamedTuple):
    """Anyone's label on the checked items, as `CROWD_FIELDS` loads it."""

    annotator_id: int | None
    external_rater: str
    item_id: int
    choice: str
    ranking: list[int] | None
    source: str
    time_spent_ms: int | None
    server_time_ms: int | None


CROWD_FIELDS = (
    "annotator_id",
    "external_rater",
    "item_id",
    "choice",
    "ranking",
    "source",
    "time_spent_ms",
    "server_time_ms",
)


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
                "accuracy": number(
                    self.gold.n_correct / self.gold.n_items if self.gold.n_items else None
                ),
                "wilson_low": number(self.gold.wilson_low),
                "judged": self.gold.judged,
            },
            "stability": {
                "n_pairs": self.stability.n_pairs,
                "agreement": number(self.stability.agreement),
                "kappa": number(self.stability.kappa),
            },
            "position": {
                "n_decisions": self.position.n_decisions,
                "n_left": self.position.n_left,
                "left_share": number(self.position.left_share),
                "p_value": number(self.position.p_value),
            },
            "speed": _speed_json(self.speed),
            "skips": _skips_json(self.skips),
            "consensus": _consensus_json(self.consensus),
        }


def _speed_json(speed: SpeedReport | None) -> dict | None:
    if speed is None:
        return None
    return {
        "n_timed": int(speed.flagged.size),
        "n_too_fast_to_read": int(speed.too_fast_to_read.sum()),
        "n_below_pool": int(speed.below_pool.sum()),
        "share_flagged": number(speed.share_flagged),
        "pool_threshold_seconds": number(speed.pool_threshold_seconds),
    }


def _skips_json(skips: SkipRate | None) -> dict | None:
    if skips is None:
        return None
    return {
        "n_served": skips.n_served,
        "n_skipped": skips.n_skipped,
        "rate": number(skips.rate),
        "pool_rate": number(skips.pool_rate),
        "p_value": number(skips.p_value),
    }


def _consensus_json(consensus: ConsensusOutlier | None) -> dict | None:
    if consensus is None:
        return None
    return {
        "n_votes": consensus.n_votes,
        "n_agree": consensus.n_agree,
        "expected_agree": number(consensus.expected_agree),
        "p_value": number(consensus.p_value),
    }


def assessment_json(assessment: AnnotatorAssessment | None) -> dict | None:
    """Return a stored assessment's verdict as shown beside its annotator."""
    if assessment is None:
        return None
    return {
        "id": assessment.pk,
        "verdict": assessment.verdict,
        "applied": assessment.applied,
        "failed_checks": assessment.failed_checks,
        "reasons": assessment.reasons,
        "notes": assessment.notes,
        "trigger": assessment.trigger,
        "created_at": assessment.created_at.isoformat(),
    }


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


def member_row(
    user_id: int,
    *,
    membership: Membership | None,
    username: str,
    sources: dict[str, int],
    n_flagged_labels: int,
    trust_weight: float,
    assessment: AnnotatorAssessment | None,
    resumed_at: datetime | None,
) -> dict:
    """Return one row of the annotator quality table (`selectors.annotator_quality_table`)."""
    return {
        "user_id": user_id,
        "username": username,
        "role": membership.role if membership else None,
        "status": membership.status if membership else None,
        "flagged": membership.flagged if membership else False,
        "status_reason": membership.status_reason if membership else "",
        "judgment_count": membership.judgment_count if membership else 0,
        "sources": sources,
        "n_flagged_labels": n_flagged_labels,
        "trust_weight": trust_weight,
        "assessment": assessment_json(assessment),
        "metrics": assessment.metrics if assessment else {},
        "resumed_at": resumed_at.isoformat() if resumed_at else None,
    }


def consensus_label(label: str | tuple[int, ...]) -> str:
    """Return the label compared with the crowd: the choice, or a ranking's best answer."""
    return label if isinstance(label, str) else top_positions(label)


@dataclass
class Crowd:
    """Everyone's labels on the checked items: consensus per source, times per item."""

    consensus: dict[str, dict[Rater, ConsensusOutlier]]
    pool_seconds: dict[tuple[str, int], list[float]]


def crowd_figures(rows: Iterable[CrowdJudgment], *, policy: QualityPolicy) -> Crowd:
    """Return the crowd's consensus outliers per source and its seconds per (source, item).

    ``rows`` leave out the labels a rater gave before their last resume
    (`evaluation.selectors.after_last_resume`): those are no part of the crowd.
    """
    votes: dict[str, list[tuple[Rater, int, str]]] = defaultdict(list)
    pool_seconds: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in rows:
        rater = rater_key(row.annotator_id, row.external_rater)
        votes[row.source].append(
            (rater, row.item_id, consensus_label(label_of(row.choice, row.ranking)))
        )
        ms = row.server_time_ms if row.server_time_ms is not None else row.time_spent_ms
        if ms:
            pool_seconds[(row.source, row.item_id)].append(ms / 1000)
    consensus = {
        source: consensus_outliers(
            source_votes, alpha=policy.consensus_alpha, min_votes=policy.min_consensus_votes
        )
        for source, source_votes in votes.items()
    }
    return Crowd(consensus, pool_seconds)


def main_source(rows: list[OwnJudgment]) -> str:
    """Return the label source an annotator is judged as: the one most of their rows carry."""
    return Counter(row.source for row in rows).most_common(1)[0][0]


def timed_and_skip_checked(rows: list[OwnJudgment]) -> bool:
    """Return whether speed and skips are judged: not for machine accounts (simulated, AI)."""
    return main_source(rows) not in MACHINE_SOURCES


def annotator_figures(
    rows: list[OwnJudgment],
    *,
    originals: dict[int, Any],
    chars: dict[int, int],
    crowd: Crowd,
    skips: SkipRate | None,
    since: datetime | None,
    policy: QualityPolicy,
) -> AnnotatorQuality:
    """Return one annotator's quality figures from their judgments since their last resume.

    ``originals`` maps an original assignment id to its label (for the repeats), ``chars``
    an item id to the length of its prompt and answers (for the reading-speed floor).
    """
    annotator_id = rows[0].annotator_id
    source = main_source(rows)
    floor_chars = policy.min_seconds_per_item * policy.reading_chars_per_second
    gold_rows, pairs, sides, seconds, lengths, pool = [], [], [], [], [], []
    for row in rows:
        label = label_of(row.choice, row.ranking)
        gold_rows.append(
            (annotator_id, label, row.gold_answer if row.item_is_gold else None, row.is_repeat)
        )
        if row.is_repeat and row.repeat_of_id in originals:
            pairs.append((label_text(originals[row.repeat_of_id]), label_text(label)))
        side = shown_side(row.shown_choice)
        if side:
            sides.append(side)
        # The server's figure first: a client that leaves out its own cannot dodge this.
        ms = row.server_time_ms if row.server_time_ms is not None else row.time_spent_ms
        if ms is not None:
            seconds.append(ms / 1000)
            # A floor of min_seconds_per_item: as if the text were at least that long.
            lengths.append(max(chars.get(row.item_id) or 0, floor_chars))
            pool.extend(crowd.pool_seconds.get((source, row.item_id), ()))
    right, answered = gold_tallies(gold_rows).get(annotator_id, (0, 0))
    machine = not timed_and_skip_checked(rows)
    return AnnotatorQuality(
        annotator_id=annotator_id,
        source=source,
        n_judgments=len(rows),
        since=since,
        gold=gold_accuracy_of_tally(right, answered, min_items=policy.min_gold_items),
        stability=intra_rater_stability(pairs),
        position=position_bias(sides),
        speed=None
        if machine
        else speed_outliers(
            seconds,
            lengths,
            reading_chars_per_second=policy.reading_chars_per_second,
            pool_seconds=pool or None,
        ),
        consensus=crowd.consensus.get(source, {}).get(annotator_id),
        judgment_ids=tuple(row.id for row in rows),
        skips=None if machine else skips,
    )


def skip_rates(
    *,
    own: Iterable[tuple[int, int, str, datetime | None]],
    pool: Iterable[tuple[int, int, int, int]],
    since: dict[int, datetime],
    skipped: str,
) -> dict[int, SkipRate]:
    """Return each annotator's skip rate against the others' on the same items.

    ``own``: the annotators' finished (annotator id, item id, status, finished at); those
    before their last resume are left out. ``pool``: (annotator id, item id, served,
    skipped) of everyone on those items; an annotator is no part of their own pool.
    """
    served: dict[int, Counter] = defaultdict(Counter)
    items_of: dict[int, set[int]] = defaultdict(set)
    for annotator_id, item_id, status, finished_at in own:
        if annotator_id in since and finished_at is not None and finished_at <= since[annotator_id]:
            continue
        served[annotator_id][status] += 1
        items_of[annotator_id].add(item_id)
    per_item: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for annotator_id, item_id, n, n_skipped in pool:
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
            counts[skipped],
            sum(counts.values()),
            pool_skipped=pool_skipped,
            pool_served=pool_served,
        )
    return rates


def sides_json(counter: Counter) -> dict:
    """Return left and right presses with the left share."""
    left, right = counter["left"], counter["right"]
    return {
        "left": left,
        "right": right,
        "left_share": left / (left + right) if left + right else None,
    }


def pairwise_distribution(rows: Iterable[tuple[str, str, str, int]]) -> dict[str, dict]:
    """Return source -> label counts, shares and sides from (source, choice, shown, n) rows."""
    counts: dict[str, Counter] = defaultdict(Counter)
    sides: dict[str, Counter] = defaultdict(Counter)
    for source, choice, shown, n in rows:
        counts[source][choice] += n
        if shown in ("A", "B"):
            sides[source]["left" if shown == "A" else "right"] += n
    out = {}
    for source, source_counts in counts.items():
        total = sum(source_counts.values())
        out[source] = {
            "n": total,
            "counts": {label: source_counts[label] for label in PAIRWISE_LABELS},
            "shares": {
                label: source_counts[label] / total if total else None for label in PAIRWISE_LABELS
            },
            **sides_json(sides[source]),
        }
    return out


def ranking_distribution(rows: Iterable[tuple[str, list[int], str]], *, k: int) -> dict[str, dict]:
    """Return source -> rank counts by position and sides from (source, ranks, shown) rows."""
    rank_counts: dict[str, np.ndarray] = {}
    sides: dict[str, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    for source, ranks, shown in rows:
        if not ranks or len(ranks) != k:
            continue
        table = rank_counts.setdefault(source, np.zeros((k, k), dtype=int))
        table[np.arange(k), np.asarray(ranks) - 1] += 1
        totals[source] += 1
        side = shown_side(shown)
        if side:
            sides[source][side] += 1
    return {
        source: {
            "n": totals[source],
            "rank_counts": table.tolist(),
            **sides_json(sides[source]),
        }
        for source, table in rank_counts.items()
    }
