"""Reward-model metrics: hand-worked ECE, AUC against sklearn, temperature recovery."""

import math

import numpy as np
import pytest
from scipy import stats

from evaluation.stats.rm_metrics import (
    bt_nll,
    evaluate_reward_model,
    expected_calibration_error,
    fit_temperature,
    length_correlation,
    margin_histogram,
    pair_confidences,
    pairwise_accuracy,
    randomized_pairs,
    reliability_diagram,
    roc_auc,
    roc_auc_random_order,
    subset_accuracy,
)


def simulate_preferences(n, seed, overconfidence=3.0):
    """Humans prefer A with prob sigmoid(delta); the RM's margin is overconfidence * delta."""
    rng = np.random.default_rng(seed)
    delta = rng.normal(0, 1.5, n)
    human_a = rng.random(n) < 1 / (1 + np.exp(-delta))
    reward_a = rng.normal(0, 1, n) + overconfidence * delta
    reward_b = reward_a - overconfidence * delta
    chosen = np.where(human_a, reward_a, reward_b)
    rejected = np.where(human_a, reward_b, reward_a)
    return chosen, rejected


class TestAccuracyAndNll:
    def test_accuracy_counts_equal_rewards_half(self):
        assert pairwise_accuracy([2, 1, 3, 0], [1, 2, 3, -1]) == pytest.approx(2.5 / 4)

    def test_nll_hand_computed(self):
        # margins 0 and ln 3: -(log 1/2 + log 3/4) / 2
        expected = -(math.log(0.5) + math.log(0.75)) / 2
        assert bt_nll([0.0, math.log(3)], [0.0, 0.0]) == pytest.approx(expected)

    def test_nll_with_soft_labels_and_temperature(self):
        # margin ln 3 at T = 1 gives p = 3/4; a soft label 1/2 gives -(log 3/4 + log 1/4) / 2
        expected = -(0.5 * math.log(0.75) + 0.5 * math.log(0.25))
        assert bt_nll([math.log(3)], [0.0], [0.5]) == pytest.approx(expected)
        assert bt_nll([2 * math.log(3)], [0.0], temperature=2.0) == pytest.approx(-math.log(0.75))


class TestAuc:
    def test_matches_sklearn_on_randomised_pairs(self):
        metrics = pytest.importorskip("sklearn.metrics")
        chosen, rejected = simulate_preferences(500, seed=1)
        scores, labels = randomized_pairs(chosen, rejected, seed=2)
        assert roc_auc(scores, labels) == pytest.approx(metrics.roc_auc_score(labels, scores))
        assert roc_auc_random_order(chosen, rejected, seed=2) == pytest.approx(
            metrics.roc_auc_score(labels, scores)
        )

    def test_hand_computed_auc_with_a_tie(self):
        # positives 0.8, 0.4; negatives 0.4, 0.1: wins 2 + 1 + tie 0.5 out of 4 pairs
        assert roc_auc([0.8, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx(3.5 / 4)

    def test_perfect_model_has_auc_one_whatever_the_order(self):
        chosen, rejected = np.arange(10.0) + 1, np.arange(10.0)
        for seed in range(5):
            assert roc_auc_random_order(chosen, rejected, seed) == pytest.approx(1.0)


class TestCalibration:
    def test_ece_hand_worked_example(self):
        confidences = [0.95, 0.85, 0.82, 0.65, 0.55, 0.52]
        correct = [1, 1, 0, 1, 0, 1]
        bins = reliability_diagram(confidences, correct, n_bins=5)
        assert [b.count for b in bins] == [0, 0, 2, 1, 3]
        assert bins[2].mean_confidence == pytest.approx(0.535)
        assert bins[2].accuracy == pytest.approx(0.5)
        assert bins[4].mean_confidence == pytest.approx(2.62 / 3)
        assert bins[4].accuracy == pytest.approx(2 / 3)
        # (2/6)|0.5 - 0.535| + (1/6)|1 - 0.65| + (3/6)|2/3 - 2.62/3|
        expected = 2 / 6 * 0.035 + 1 / 6 * 0.35 + 3 / 6 * abs(2 / 3 - 2.62 / 3)
        assert expected_calibration_error(confidences, correct, n_bins=5) == pytest.approx(expected)

    def test_bins_are_right_closed(self):
        bins = reliability_diagram([0.5, 0.6, 0.0], [1, 1, 1], n_bins=5)
        assert [b.count for b in bins] == [1, 0, 2, 0, 0]

    def test_pair_confidences(self):
        conf, correct = pair_confidences([math.log(3), 0.0, 0.0], [0.0, math.log(3), 0.0])
        assert conf == pytest.approx([0.75, 0.75, 0.5])
        assert correct.tolist() == [1.0, 0.0, 0.5]

    def test_temperature_scaling_recovers_overconfidence(self):
        validation = simulate_preferences(20_000, seed=3, overconfidence=3.0)
        temperature = fit_temperature(*validation)
        assert temperature == pytest.approx(3.0, rel=0.1)
        test = simulate_preferences(20_000, seed=4, overconfidence=3.0)
        before = expected_calibration_error(*pair_confidences(*test))
        after = expected_calibration_error(*pair_confidences(*test, temperature=temperature))
        assert after < before / 3
        assert bt_nll(*test, temperature=temperature) < bt_nll(*test)


class TestDiagnostics:
    def test_margin_histogram(self):
        counts, edges = margin_histogram([1, 2, 3, 4], [0, 0, 0, 0], bins=[0, 2, 4])
        assert counts.tolist() == [1, 3]
        assert edges.tolist() == [0, 2, 4]

    def test_length_correlation_matches_scipy(self):
        rng = np.random.default_rng(5)
        lengths = rng.integers(10, 1000, 200)
        rewards = 0.002 * lengths + rng.normal(0, 1, 200)
        result = length_correlation(rewards, lengths)
        assert result["spearman"] == pytest.approx(stats.spearmanr(rewards, lengths).statistic)
        assert result["pearson"] == pytest.approx(stats.pearsonr(rewards, lengths).statistic)
        assert result["pearson"] > 0.3

    def test_subsets(self):
        chosen = [2.0, 2.0, 0.0, 1.0, 0.0]
        rejected = [1.0, 3.0, 1.0, 1.5, 0.4]
        agreement = [1.0, 0.5, 0.55, 0.9, 1.0]
        ties = [False, False, False, False, True]
        result = subset_accuracy(chosen, rejected, agreement=agreement, ties=ties)
        assert result["all"].n == 4
        assert result["all"].accuracy == pytest.approx(0.25)
        assert result["low_agreement"].n == 2 and result["low_agreement"].accuracy == 0.0
        assert result["high_agreement"].accuracy == pytest.approx(0.5)
        assert result["tie"].n == 1
        assert result["tie"].mean_abs_margin == pytest.approx(0.4)


def test_evaluate_reward_model_report():
    chosen, rejected = simulate_preferences(300, seed=6)
    report = evaluate_reward_model(
        chosen,
        rejected,
        chosen_lengths=np.arange(300),
        rejected_lengths=np.arange(300),
        temperature=2.0,
    )
    assert report["n_pairs"] == 300
    assert 0.5 < report["accuracy"] < 1
    assert report["nll_at_temperature"] != report["nll"]
    assert sum(b.count for b in report["reliability"]) == 300
    assert sum(report["margin_histogram"]["counts"]) == 300
    assert "length_correlation" in report
