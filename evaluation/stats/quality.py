"""Annotator quality checks on plain lists, and a pass/pause verdict from project thresholds.

Gold accuracy, self-agreement on repeats, position bias, speed, skip rate, and agreement with
the crowd's consensus. Numpy/scipy only, no Django.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from evaluation.stats.agreement import cohen_kappa

PASS, PAUSE = "pass", "pause"


@dataclass(frozen=True)
class GoldAccuracy:
    """Accuracy on gold items; ``judged`` is False until enough gold items were answered."""

    n_items: int
    n_correct: int
    accuracy: float | None
    wilson_low: float | None
    judged: bool


@dataclass(frozen=True)
class Stability:
    """Agreement of an annotator with themself on planned repeats."""

    n_pairs: int
    agreement: float | None
    kappa: float | None


@dataclass(frozen=True)
class PositionBias:
    """Share of A/B decisions that went to the left-hand answer, with a binomial test."""

    n_decisions: int
    n_left: int
    left_share: float | None
    p_value: float | None


@dataclass(frozen=True)
class SpeedReport:
    """Per-judgment speed flags and the thresholds behind them."""

    too_fast_to_read: np.ndarray
    below_pool: np.ndarray
    pool_threshold_seconds: float | None

    @property
    def flagged(self) -> np.ndarray:
        """Return judgments flagged by either rule."""
        return self.too_fast_to_read | self.below_pool

    @property
    def share_flagged(self) -> float | None:
        """Return the share of flagged judgments."""
        return float(self.flagged.mean()) if self.flagged.size else None


@dataclass(frozen=True)
class SkipRate:
    """Share of served items an annotator skipped, against the other annotators' share."""

    n_served: int
    n_skipped: int
    rate: float | None
    pool_rate: float | None
    p_value: float | None


@dataclass(frozen=True)
class ConsensusOutlier:
    """How often an annotator agreed with the other annotators' consensus, and how unlikely."""

    annotator: Hashable
    n_votes: int
    n_agree: int
    expected_agree: float
    p_value: float
    flagged: bool


@dataclass(frozen=True)
class QualityThresholds:
    """Per-project limits for ``assess_annotator``."""

    min_gold_items: int = field(default=10, metadata={"help": "gold answers needed to judge"})
    min_gold_accuracy: float = field(default=0.7, metadata={"help": "pause below this"})
    confidence: float | None = field(
        default=None,
        metadata={
            "help": "pause on gold accuracy or self-agreement only when the Wilson upper"
            " bound at this confidence is below the floor; None judges the point estimate"
        },
    )
    min_repeat_pairs: int = field(default=5, metadata={"help": "repeats needed to judge"})
    min_stability: float = field(default=0.6, metadata={"help": "self-agreement floor"})
    min_position_decisions: int = field(default=20, metadata={"help": "A/B votes needed"})
    position_alpha: float = field(
        default=0.001, metadata={"help": "binomial test level over all of an annotator's checks"}
    )
    max_position_skew: float = field(
        default=0.15, metadata={"help": "|left share - 0.5| must also exceed this"}
    )
    min_timed_judgments: int = field(default=10, metadata={"help": "timed votes needed"})
    max_fast_share: float = field(default=0.2, metadata={"help": "share of too-fast votes"})
    min_skip_served: int = field(default=20, metadata={"help": "served items needed"})
    max_skip_excess: float = field(
        default=0.2, metadata={"help": "skip rate - pool rate must also exceed this"}
    )
    skip_alpha: float = field(
        default=0.001, metadata={"help": "skip-rate test level over all of an annotator's checks"}
    )
    min_consensus_votes: int = field(default=20, metadata={"help": "shared votes needed"})
    consensus_alpha: float = field(
        default=0.001, metadata={"help": "outlier test level over all of an annotator's checks"}
    )


@dataclass(frozen=True)
class Assessment:
    """Verdict for one annotator: pass or pause, why, and what could not be judged yet."""

    status: str
    reasons: list[str]
    notes: list[str]


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Return the Wilson score interval for a binomial proportion."""
    if n == 0:
        return (0.0, 1.0)
    z = stats.norm.ppf(0.5 + confidence / 2)
    p = successes / n
    # Wilson (1927): (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    low = max(0.0, (centre - spread) / denominator)
    high = min(1.0, (centre + spread) / denominator)
    return (float(low), float(high))


def gold_accuracy(
    answers: Sequence[Hashable], gold: Sequence[Hashable], *, min_items: int = 10
) -> GoldAccuracy:
    """Return accuracy on gold items, withholding judgement below ``min_items`` answers."""
    if len(answers) != len(gold):
        raise ValueError("answers and gold must have the same length")
    n_correct = sum(a == g for a, g in zip(answers, gold, strict=True))
    return gold_accuracy_of_tally(n_correct, len(answers), min_items=min_items)


def gold_accuracy_of_tally(n_correct: int, n_items: int, *, min_items: int = 10) -> GoldAccuracy:
    """Return accuracy from counts of right and answered gold items (none below ``min_items``)."""
    if n_items < max(min_items, 1):
        return GoldAccuracy(n_items, n_correct, None, None, False)
    low, _ = wilson_interval(n_correct, n_items)
    return GoldAccuracy(n_items, n_correct, n_correct / n_items, low, True)


def intra_rater_stability(pairs: Iterable[tuple[Hashable, Hashable]]) -> Stability:
    """Return self-agreement and kappa over (first, repeat) labels already in canonical terms.

    The repeat was shown with sides flipped; the caller maps it back (A <-> B) first, so a
    consistent annotator gives identical labels.
    """
    pairs = list(pairs)
    if not pairs:
        return Stability(0, None, None)
    first = [p[0] for p in pairs]
    second = [p[1] for p in pairs]
    agreement = sum(a == b for a, b in pairs) / len(pairs)
    kappa = cohen_kappa(first, second)
    return Stability(len(pairs), agreement, None if math.isnan(kappa) else kappa)


def position_bias(
    sides: Iterable[str], *, left: str = "left", right: str = "right"
) -> PositionBias:
    """Return the share of A/B decisions for the left answer and a two-sided binomial p-value.

    Only ``left`` and ``right`` entries count; ties and both-bad should be left out or are
    ignored.
    """
    counts = Counter(sides)
    n_left, n_right = counts.get(left, 0), counts.get(right, 0)
    n = n_left + n_right
    if n == 0:
        return PositionBias(0, 0, None, None)
    p_value = stats.binomtest(n_left, n, 0.5, alternative="two-sided").pvalue
    return PositionBias(n, n_left, n_left / n, float(p_value))


def speed_outliers(
    seconds: Sequence[float],
    chars: Sequence[float],
    *,
    reading_chars_per_second: float = 50.0,
    pool_seconds: Sequence[float] | None = None,
    k: float = 3.0,
) -> SpeedReport:
    """Flag judgments made too fast to read, or far faster than the annotator pool.

    Rule 1: ``seconds < chars / reading_chars_per_second``; 50 chars/s is about 600 words per
    minute, over twice typical silent reading speed (Brysbaert 2019), so only skimming trips it.
    Rule 2: log time below median - k * MAD (scaled to sigma) of the pool's log times; logs
    because response times are right-skewed. ``pool_seconds`` defaults to ``seconds``.
    """
    times = np.asarray(seconds, dtype=float)
    lengths = np.asarray(chars, dtype=float)
    if times.shape != lengths.shape:
        raise ValueError("seconds and chars must have the same length")
    too_fast = times < lengths / reading_chars_per_second
    pool = np.asarray(times if pool_seconds is None else pool_seconds, dtype=float)
    pool = pool[pool > 0]
    threshold = None
    below = np.zeros(times.shape, dtype=bool)
    if pool.size >= 3:
        logs = np.log(pool)
        centre = np.median(logs)
        # Robust z-score: MAD * 1.4826 estimates sigma under normality (Leys et al. 2013)
        mad = 1.4826 * np.median(np.abs(logs - centre))
        if mad > 0:
            threshold = float(np.exp(centre - k * mad))
            below = times < threshold
    return SpeedReport(too_fast, below, threshold)


def skip_rate(n_skipped: int, n_served: int, *, pool_skipped: int, pool_served: int) -> SkipRate:
    """Return an annotator's skip rate and a one-sided binomial p-value against the pool's.

    The pool's rate is Laplace-smoothed, (skipped + 1) / (served + 2), so a pool that never
    skips (or a small one) does not make a single skip look impossible.
    """
    if n_skipped > n_served or pool_skipped > pool_served:
        raise ValueError("skipped items must be among the served ones")
    pool_rate = (pool_skipped + 1) / (pool_served + 2)
    if n_served == 0:
        return SkipRate(0, 0, None, pool_rate, None)
    # P(X >= n_skipped) for X ~ Binomial(n_served, pool_rate).
    p_value = stats.binom.sf(n_skipped - 1, n_served, pool_rate)
    return SkipRate(n_served, n_skipped, n_skipped / n_served, pool_rate, float(p_value))


def _poisson_binomial_cdf(successes: int, probabilities: np.ndarray) -> float:
    """Return P(X <= successes) for a sum of independent Bernoulli(p_i)."""
    # Recursion P_i(k) = P_{i-1}(k)(1 - p_i) + P_{i-1}(k - 1) p_i  (Chen & Liu 1997, sec. 2)
    distribution = np.zeros(probabilities.size + 1)
    distribution[0] = 1.0
    for i, p in enumerate(probabilities, start=1):
        distribution[1 : i + 1] = distribution[1 : i + 1] * (1 - p) + distribution[:i] * p
        distribution[0] *= 1 - p
    return float(min(1.0, distribution[: successes + 1].sum()))


def consensus_outliers(
    votes: Iterable[tuple[Hashable, Hashable, Hashable]],
    *,
    alpha: float = 0.01,
    min_votes: int = 5,
) -> dict[Hashable, ConsensusOutlier]:
    """Flag annotators who agree with the other annotators' consensus improbably rarely.

    ``votes`` are ``(annotator, item, label)``. For each vote the consensus is the modal label
    of the *other* annotators on that item (all modes count when they tie). Under the null
    hypothesis the annotator behaves like the pool, so a vote agrees with probability q, the
    agreement rate of the *other* annotators' votes whose consensus looked the same (same
    number of other votes, size of the mode, number of modes), Laplace-smoothed. The
    annotator's own votes are left out of that rate: in a small pool (three annotators per
    item) the votes whose consensus is a clear mode are mostly the outlier's own, and a rate
    that counted them would make a random clicker its own yardstick. The exact Poisson-binomial
    P(agreements <= observed) is the annotator's p-value. This follows the idea of Chatbot
    Arena's anomalous-user detection (Chiang et al. 2024, section 5.1; FastChat
    ``outlier_detect``): per-vote evidence against the crowd, combined per user.
    """
    votes = list(votes)
    per_item: dict[Hashable, Counter] = defaultdict(Counter)
    for _, item, label in votes:
        per_item[item][label] += 1
    records: list[tuple[Hashable, tuple[int, int, int], bool]] = []
    bucket_hits: Counter = Counter()
    bucket_size: Counter = Counter()
    own_hits: Counter = Counter()
    own_size: Counter = Counter()
    for annotator, item, label in votes:
        pool = per_item[item].copy()
        pool[label] -= 1
        pool_size = sum(pool.values())
        if pool_size == 0:
            continue
        top = max(pool.values())
        modes = {lab for lab, count in pool.items() if count == top}
        key = (pool_size, top, len(modes))
        hit = label in modes
        records.append((annotator, key, hit))
        bucket_hits[key] += hit
        bucket_size[key] += 1
        own_hits[annotator, key] += hit
        own_size[annotator, key] += 1
    agree: dict[Hashable, list[bool]] = defaultdict(list)
    chance: dict[Hashable, list[float]] = defaultdict(list)
    for annotator, key, hit in records:
        others_hits = bucket_hits[key] - own_hits[annotator, key]
        others_size = bucket_size[key] - own_size[annotator, key]
        agree[annotator].append(hit)
        chance[annotator].append((others_hits + 1) / (others_size + 2))
    results: dict[Hashable, ConsensusOutlier] = {}
    for annotator, hits in agree.items():
        q = np.asarray(chance[annotator])
        n_agree = int(sum(hits))
        p_value = _poisson_binomial_cdf(n_agree, q)
        results[annotator] = ConsensusOutlier(
            annotator=annotator,
            n_votes=len(hits),
            n_agree=n_agree,
            expected_agree=float(q.sum()),
            p_value=p_value,
            flagged=len(hits) >= min_votes and p_value < alpha,
        )
    return results


def _below(successes: int, n: int, floor: float, confidence: float | None) -> bool:
    """Return whether a rate is below a floor: its point estimate, or its Wilson upper bound."""
    if confidence is None:
        return successes / n < floor
    return wilson_interval(successes, n, confidence)[1] < floor


def _bound_note(successes: int, n: int, t: QualityThresholds) -> str:
    if t.confidence is None:
        return ""
    upper = wilson_interval(successes, n, t.confidence)[1]
    return f" ({100 * t.confidence:.3g}% upper bound {upper:.2f})"


def spent_level(level: float, look: int | None) -> float:
    """Return the test level of an annotator's ``look``-th check (1, 2, ...) under a budget.

    An annotator is checked again and again as their judgments accumulate, and testing every
    check at the same level pauses an honest annotator with a chance that grows without bound
    with the number of checks (Armitage, McPherson & Rowe 1969, "Repeated significance tests
    on accumulating data"). The k-th check gets ``level * 6 / (pi^2 k^2)``: since the sum of
    1/k^2 is pi^2/6, all the checks together spend at most ``level`` (a union bound), so
    ``level`` is the chance over the annotator's whole time in the project that the test
    pauses them while they label like everyone else. ``look=None`` is a single test at
    ``level``.
    """
    if look is None:
        return level
    if look < 1:
        raise ValueError("look counts checks from 1")
    return level * 6 / (math.pi**2 * look**2)


def thresholds_at_look(thresholds: QualityThresholds, look: int | None) -> QualityThresholds:
    """Return the thresholds with every test level spent for check ``look`` (`spent_level`).

    The binomial and consensus tests get the spent level; the Wilson bounds of gold accuracy
    and self-agreement the confidence whose error is the spent level.
    """
    if look is None:
        return thresholds
    t = thresholds
    return replace(
        t,
        position_alpha=spent_level(t.position_alpha, look),
        skip_alpha=spent_level(t.skip_alpha, look),
        consensus_alpha=spent_level(t.consensus_alpha, look),
        confidence=None if t.confidence is None else 1 - spent_level(1 - t.confidence, look),
    )


def assess_annotator(
    *,
    thresholds: QualityThresholds,
    look: int | None = None,
    gold: GoldAccuracy | None = None,
    stability: Stability | None = None,
    position: PositionBias | None = None,
    speed: SpeedReport | None = None,
    skips: SkipRate | None = None,
    consensus: ConsensusOutlier | None = None,
) -> Assessment:
    """Return pause with reasons if any check fails its threshold, else pass.

    Checks without enough data are not failed; they are listed in ``notes``. With
    ``thresholds.confidence`` set, gold accuracy and self-agreement fail only when their
    Wilson upper bound is below the floor, so a short unlucky streak does not pause a good
    annotator while a clear failure needs few items. ``look`` is which check of this
    annotator this is (1 for the first since they started or were resumed): the test levels
    are then spent across their checks (`thresholds_at_look`), so checking often does not
    raise the chance of pausing an honest annotator.
    """
    reasons: list[str] = []
    notes: list[str] = []
    t = thresholds_at_look(thresholds, look)
    if gold is not None:
        if gold.n_items < t.min_gold_items:
            notes.append(f"gold: {gold.n_items} of {t.min_gold_items} items needed")
        elif _below(gold.n_correct, gold.n_items, t.min_gold_accuracy, t.confidence):
            reasons.append(
                f"gold accuracy {gold.n_correct / gold.n_items:.2f} < {t.min_gold_accuracy:.2f}"
                f" on {gold.n_items} items{_bound_note(gold.n_correct, gold.n_items, t)}"
            )
    if stability is not None:
        if stability.n_pairs < t.min_repeat_pairs:
            notes.append(f"stability: {stability.n_pairs} of {t.min_repeat_pairs} repeats needed")
        elif stability.agreement is not None and _below(
            round(stability.agreement * stability.n_pairs),
            stability.n_pairs,
            t.min_stability,
            t.confidence,
        ):
            same = round(stability.agreement * stability.n_pairs)
            reasons.append(
                f"self-agreement {stability.agreement:.2f} < {t.min_stability:.2f}"
                f" on {stability.n_pairs} repeats{_bound_note(same, stability.n_pairs, t)}"
            )
    if position is not None:
        if position.n_decisions < t.min_position_decisions:
            notes.append(
                f"position bias: {position.n_decisions} of {t.min_position_decisions}"
                " A/B decisions needed"
            )
        elif (
            position.p_value is not None
            and position.p_value < t.position_alpha
            and abs(position.left_share - 0.5) > t.max_position_skew
        ):
            reasons.append(
                f"left answer chosen {position.left_share:.0%} of {position.n_decisions}"
                f" decisions (binomial p = {position.p_value:.2g} < {t.position_alpha:.2g})"
            )
    if speed is not None:
        n_timed = speed.flagged.size
        if n_timed < t.min_timed_judgments:
            notes.append(f"speed: {n_timed} of {t.min_timed_judgments} timed judgments needed")
        elif speed.share_flagged > t.max_fast_share:
            reasons.append(
                f"{speed.share_flagged:.0%} of {n_timed} judgments too fast"
                f" (limit {t.max_fast_share:.0%})"
            )
    if skips is not None:
        if skips.n_served < t.min_skip_served:
            notes.append(f"skip rate: {skips.n_served} of {t.min_skip_served} served items needed")
        elif (
            skips.p_value is not None
            and skips.p_value < t.skip_alpha
            and skips.rate - skips.pool_rate > t.max_skip_excess
        ):
            reasons.append(
                f"skipped {skips.rate:.0%} of {skips.n_served} items, others"
                f" {skips.pool_rate:.0%} of the same items"
                f" (binomial p = {skips.p_value:.2g} < {t.skip_alpha:.2g})"
            )
    if consensus is not None:
        if consensus.n_votes < t.min_consensus_votes:
            notes.append(
                f"consensus: {consensus.n_votes} of {t.min_consensus_votes} shared votes needed"
            )
        elif consensus.p_value < t.consensus_alpha:
            reasons.append(
                f"agreed with consensus {consensus.n_agree} of {consensus.n_votes} times,"
                f" {consensus.expected_agree:.1f} expected"
                f" (p = {consensus.p_value:.2g} < {t.consensus_alpha:.2g})"
            )
    return Assessment(PAUSE if reasons else PASS, reasons, notes)
