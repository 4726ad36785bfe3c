"""Annotator quality checks: published intervals, hand-worked cases and simulated annotators."""

import math

import numpy as np
import pytest
from scipy import stats

from evaluation.stats.quality import (
    PASS,
    PAUSE,
    ConsensusOutlier,
    QualityThresholds,
    _poisson_binomial_cdf,
    assess_annotator,
    consensus_outliers,
    gold_accuracy,
    intra_rater_stability,
    position_bias,
    speed_outliers,
    spent_level,
    thresholds_at_look,
    wilson_interval,
)


class TestGoldAccuracy:
    @pytest.mark.parametrize(
        ("successes", "n", "low", "high"),
        [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611),
         (1, 29, 0.0061, 0.1718)],
    )  # fmt: skip
    def test_wilson_interval_matches_newcombe_1998(self, successes, n, low, high):
        # Newcombe (1998) Stat Med 17:857, Table II, method 3 (score interval without CC)
        assert wilson_interval(successes, n) == pytest.approx((low, high), abs=5e-5)

    def test_not_judged_below_minimum(self):
        result = gold_accuracy(["A"] * 4, ["A"] * 4, min_items=5)
        assert not result.judged
        assert result.accuracy is None
        assert result.n_correct == 4

    def test_accuracy_and_lower_bound(self):
        answers = ["A", "B", "tie", "A", "B", "A", "A", "B", "A", "both_bad"]
        gold = ["A", "B", "A", "A", "B", "A", "B", "B", "A", "both_bad"]
        result = gold_accuracy(answers, gold, min_items=10)
        assert result.judged
        assert result.accuracy == pytest.approx(0.8)
        assert result.wilson_low == pytest.approx(wilson_interval(8, 10)[0])


class TestStability:
    def test_agreement_and_kappa_on_repeats(self):
        # second labels already mapped back from the flipped presentation
        pairs = [("A", "A"), ("B", "B"), ("A", "B"), ("tie", "tie"), ("B", "B")]
        result = intra_rater_stability(pairs)
        assert result.n_pairs == 5
        assert result.agreement == pytest.approx(0.8)
        # p_o = 0.8; p_e = (2*1 + 2*3 + 1*1) / 25 = 0.36; kappa = 0.44 / 0.64
        assert result.kappa == pytest.approx(0.44 / 0.64)

    def test_empty(self):
        assert intra_rater_stability([]).agreement is None


class TestPositionBias:
    def test_share_and_binomial_p_value(self):
        sides = ["left"] * 30 + ["right"] * 10 + ["tie"] * 7
        result = position_bias(sides)
        assert (result.n_decisions, result.n_left) == (40, 30)
        assert result.left_share == pytest.approx(0.75)
        # two-sided: 2 * P(X >= 30), X ~ Bin(40, 1/2)
        assert result.p_value == pytest.approx(2 * stats.binom.sf(29, 40, 0.5))

    def test_balanced_is_not_significant(self):
        assert position_bias(["left", "right"] * 20).p_value == pytest.approx(1.0)


class TestSpeed:
    def test_too_fast_to_read(self):
        # 1000 chars at 50 chars/s need 20 s
        report = speed_outliers([5, 25, 19.9], [1000, 1000, 1000])
        assert report.too_fast_to_read.tolist() == [True, False, True]

    def test_below_pool_median_minus_k_mad(self):
        pool = [10, 12, 15, 20, 30, 8, 11, 14, 16, 25]
        report = speed_outliers([0.5, 12.0], [0, 0], pool_seconds=pool, k=3.0)
        logs = np.log(pool)
        mad = 1.4826 * np.median(np.abs(logs - np.median(logs)))
        assert report.pool_threshold_seconds == pytest.approx(math.exp(np.median(logs) - 3 * mad))
        assert report.below_pool.tolist() == [True, False]
        assert report.share_flagged == pytest.approx(0.5)


class TestConsensusOutliers:
    def test_poisson_binomial_reduces_to_binomial(self):
        for k in range(11):
            assert _poisson_binomial_cdf(k, np.full(10, 0.3)) == pytest.approx(
                stats.binom.cdf(k, 10, 0.3)
            )

    def test_poisson_binomial_against_enumeration(self):
        probabilities = np.array([0.1, 0.5, 0.9])
        # P(X = 0) = .9 * .5 * .1; P(X = 1) = .1*.5*.1 + .9*.5*.1 + .9*.5*.9
        p0 = 0.9 * 0.5 * 0.1
        p1 = 0.1 * 0.5 * 0.1 + 0.9 * 0.5 * 0.1 + 0.9 * 0.5 * 0.9
        assert _poisson_binomial_cdf(1, probabilities) == pytest.approx(p0 + p1)

    def test_random_clicker_is_flagged_and_honest_annotators_are_not(self):
        # Given 12 honest annotators who pick the item's true label 85% of the time
        rng = np.random.default_rng(0)
        labels = ["A", "B", "tie", "both_bad"]
        votes = []
        for item in range(150):
            truth = labels[rng.choice(4, p=[0.45, 0.45, 0.05, 0.05])]
            raters = rng.choice(12, 4, replace=False)
            for r in raters:
                label = truth if rng.random() < 0.85 else labels[rng.integers(4)]
                votes.append((f"h{r}", item, label))
            # and one annotator who clicks at random on every item
            votes.append(("clicker", item, labels[rng.integers(4)]))
        results = consensus_outliers(votes, alpha=0.01)
        assert results["clicker"].flagged
        assert results["clicker"].n_agree < results["clicker"].expected_agree
        assert sum(results[f"h{r}"].flagged for r in range(12)) <= 1

    def test_honest_pool_is_flagged_at_no_more_than_the_nominal_rate(self):
        # Given 40 exchangeable annotators at 80% accuracy, 5 per item
        labels = ["A", "B", "tie", "both_bad"]
        flagged = []
        for seed in range(3):
            rng = np.random.default_rng(seed)
            votes = []
            for item in range(600):
                truth = labels[rng.choice(4, p=[0.45, 0.45, 0.05, 0.05])]
                for r in rng.choice(40, 5, replace=False):
                    label = truth if rng.random() < 0.8 else labels[rng.integers(4)]
                    votes.append((r, item, label))
            results = consensus_outliers(votes, alpha=0.1)
            flagged += [result.flagged for result in results.values()]
        # Then the false-positive rate stays near or below alpha
        assert np.mean(flagged) <= 0.15

    def test_random_clicker_in_a_pool_of_three_is_flagged(self):
        # Given two careful annotators (90% right) and a random clicker on the same 30 items:
        # the clicker's votes are the only ones whose consensus is a clear two-vote mode, so a
        # chance rate that counted its own votes would hold it to its own 25%.
        labels = ["A", "B", "tie", "both_bad"]
        flagged = []
        for seed in range(20):
            rng = np.random.default_rng(seed)
            votes = []
            for item in range(30):
                truth = labels[rng.integers(2)]
                for rater in ("h1", "h2"):
                    label = truth if rng.random() < 0.9 else labels[rng.integers(4)]
                    votes.append((rater, item, label))
                votes.append(("clicker", item, labels[rng.integers(4)]))
            results = consensus_outliers(votes, alpha=0.01, min_votes=20)
            flagged.append(results["clicker"].flagged)
            assert not results["h1"].flagged and not results["h2"].flagged
        # Then 30 shared votes are enough to flag the clicker, nearly always
        assert np.mean(flagged) >= 0.9

    def test_votes_without_others_are_skipped(self):
        results = consensus_outliers([("x", 1, "A"), ("y", 2, "B")])
        assert results == {}


class TestAssessAnnotator:
    def test_pass_with_notes_for_missing_evidence(self):
        result = assess_annotator(
            thresholds=QualityThresholds(),
            gold=gold_accuracy(["A"] * 3, ["A"] * 3, min_items=10),
            position=position_bias(["left", "right"] * 20),
        )
        assert result.status == PASS
        assert result.reasons == []
        assert result.notes == ["gold: 3 of 10 items needed"]

    def test_pause_lists_every_failed_check(self):
        thresholds = QualityThresholds(min_gold_items=5, min_gold_accuracy=0.8)
        result = assess_annotator(
            thresholds=thresholds,
            gold=gold_accuracy(["A", "B", "A", "A", "B"], ["A", "A", "B", "A", "A"], min_items=5),
            stability=intra_rater_stability([("A", "B")] * 4 + [("A", "A")] * 2),
            position=position_bias(["left"] * 45 + ["right"] * 5),
            speed=speed_outliers([1.0] * 10, [500] * 10),
            consensus=ConsensusOutlier("x", 40, 10, 30.0, 1e-6, True),
        )
        assert result.status == PAUSE
        assert len(result.reasons) == 5
        assert result.reasons[0] == "gold accuracy 0.40 < 0.80 on 5 items"
        assert "left answer chosen 90% of 50 decisions" in result.reasons[2]

    def test_significant_but_small_position_skew_passes(self):
        # 52% left over 100,000 decisions is significant but below the 15-point skew limit
        position = position_bias(["left"] * 52_000 + ["right"] * 48_000)
        assert position.p_value < 1e-6
        result = assess_annotator(thresholds=QualityThresholds(), position=position)
        assert result.status == PASS


def _ever_paused_for_position(thresholds: QualityThresholds, *, every: int, looks: int, spend):
    """Exact chance that an unbiased annotator (each A/B press left with p 1/2) is ever paused
    by the position test, checked after every ``every`` decisions ``looks`` times.

    Dynamic programming over the count of left presses: at each check the mass in the
    region our `assess_annotator` rejects is absorbed (paused) and the rest walks on.
    """
    alive = np.zeros(1)
    alive[0] = 1.0
    paused = 0.0
    for look in range(1, looks + 1):
        for _ in range(every):
            alive = np.concatenate([alive, [0.0]]) * 0.5 + np.concatenate([[0.0], alive]) * 0.5
        n = alive.size - 1
        for n_left in range(n + 1):
            position = position_bias(["left"] * n_left + ["right"] * (n - n_left))
            verdict = assess_annotator(
                thresholds=thresholds, look=look if spend else None, position=position
            )
            if verdict.status == PAUSE:
                paused += alive[n_left]
                alive[n_left] = 0.0
    return paused


class TestSpentLevels:
    def test_the_levels_of_all_checks_sum_to_at_most_the_budget(self):
        levels = [spent_level(0.01, k) for k in range(1, 100_001)]
        assert levels[0] == pytest.approx(0.01 * 6 / math.pi**2)  # 0.006079
        assert levels[1] == pytest.approx(levels[0] / 4)
        assert sum(levels) < 0.01 and sum(levels) > 0.01 * 0.9999
        assert spent_level(0.01, None) == 0.01
        with pytest.raises(ValueError):
            spent_level(0.01, 0)

    def test_thresholds_at_a_look_spend_every_test_and_the_wilson_confidence(self):
        t = thresholds_at_look(QualityThresholds(confidence=0.95), 2)
        assert t.position_alpha == pytest.approx(0.001 * 6 / (math.pi**2 * 4))
        assert t.consensus_alpha == t.skip_alpha == t.position_alpha
        assert 1 - t.confidence == pytest.approx(0.05 * 6 / (math.pi**2 * 4))
        assert thresholds_at_look(QualityThresholds(), None) == QualityThresholds()

    def test_checking_often_pauses_an_unbiased_annotator_unless_the_level_is_spent(self):
        # Given the position test at 1 % checked every 20 decisions up to 400 decisions
        thresholds = QualityThresholds(position_alpha=0.01)
        unspent = _ever_paused_for_position(thresholds, every=20, looks=20, spend=False)
        spent = _ever_paused_for_position(thresholds, every=20, looks=20, spend=True)
        # Then testing each check at 1 % pauses an unbiased annotator more often than 1 %
        # (Armitage, McPherson & Rowe 1969), while spending keeps it under the budget
        assert unspent > 0.01
        assert spent < 0.01 and spent < unspent / 2

    def test_a_spent_level_still_pauses_an_always_left_annotator_at_the_first_check(self):
        position = position_bias(["left"] * 20)
        assert (
            assess_annotator(thresholds=QualityThresholds(), look=1, position=position).status
            == PAUSE
        )
        # and at a late check with enough presses: 60 of 60 left, p = 1.7e-18
        late = position_bias(["left"] * 60)
        assert (
            assess_annotator(thresholds=QualityThresholds(), look=50, position=late).status == PAUSE
        )
