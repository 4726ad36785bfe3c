"""Win rate: conventions, a hand-computable bootstrap, coverage, and length control."""

import numpy as np
import pytest

from evaluation.stats.winrate import (
    CONVENTION,
    length_controlled_win_rate,
    vs_baseline,
    win_rate,
)


class TestCounts:
    def test_convention_ties_half_both_bad_excluded(self):
        outcomes = ["win"] * 5 + ["tie"] * 2 + ["loss"] * 3 + ["both_bad"] * 4
        result = win_rate(outcomes, n_boot=0)
        assert (result.wins, result.ties, result.losses, result.both_bad) == (5, 2, 3, 4)
        assert result.win_rate == pytest.approx((5 + 0.5 * 2) / 10)
        assert result.convention == CONVENTION

    def test_only_both_bad_has_no_win_rate(self):
        assert win_rate(["both_bad"], n_boot=10).win_rate is None

    def test_vs_baseline_maps_sides(self):
        battles = [
            (1, "ours", "base", "A"),
            (1, "base", "ours", "A"),
            (2, "base", "ours", "tie"),
            (3, "ours", "other", "A"),
            (4, "base", "ours", "both_bad"),
        ]
        prompts, outcomes = vs_baseline(battles, "ours", "base")
        assert prompts == [1, 1, 2, 4]
        assert outcomes == ["win", "loss", "tie", "both_bad"]

    def test_unknown_outcome_is_rejected(self):
        with pytest.raises(ValueError, match="not one of"):
            win_rate(["draw"])


class TestClusteredBootstrap:
    def test_hand_computable_two_prompt_case(self):
        # Prompt p1 has two wins, p2 one loss. Resampling two prompts gives {p1,p1} -> 1,
        # {p2,p2} -> 0 (prob 1/4 each) and {p1,p2} -> 2/3 (prob 1/2).
        result = win_rate(["win", "win", "loss"], ["p1", "p1", "p2"], n_boot=20_000, seed=1)
        assert result.win_rate == pytest.approx(2 / 3)
        values, counts = np.unique(np.round(result.bootstrap, 6), return_counts=True)
        assert values.tolist() == pytest.approx([0.0, 2 / 3, 1.0])
        assert counts / counts.sum() == pytest.approx([0.25, 0.5, 0.25], abs=0.015)
        assert (result.ci_low, result.ci_high) == (0.0, 1.0)
        narrow = win_rate(["win", "win", "loss"], ["p1", "p1", "p2"], n_boot=20_000, alpha=0.6)
        assert (narrow.ci_low, narrow.ci_high) == pytest.approx((2 / 3, 2 / 3))

    def test_votes_are_their_own_clusters_without_prompt_ids(self):
        result = win_rate(["win", "win", "loss"], n_boot=20_000, seed=2)
        # three votes resampled: win share k/3 with k ~ Bin(3, 2/3)
        values, counts = np.unique(np.round(result.bootstrap, 6), return_counts=True)
        expected = np.array([1, 6, 12, 8]) / 27
        assert values.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])
        assert counts / counts.sum() == pytest.approx(expected, abs=0.015)

    def test_coverage_on_clustered_simulation(self):
        # Given prompts whose own win probability varies (Beta(1.2, 0.8), mean 0.6) and five
        # correlated votes per prompt
        rng = np.random.default_rng(3)
        truth = 0.6
        clustered_hits, naive_hits = [], []
        for _ in range(200):
            p = rng.beta(1.2, 0.8, size=80)
            wins = rng.random((80, 5)) < p[:, None]
            outcomes = np.where(wins, "win", "loss").ravel().tolist()
            prompts = np.repeat(np.arange(80), 5).tolist()
            seed = int(rng.integers(1 << 30))
            clustered = win_rate(outcomes, prompts, n_boot=400, seed=seed)
            naive = win_rate(outcomes, n_boot=400, seed=seed)
            clustered_hits.append(clustered.ci_low <= truth <= clustered.ci_high)
            naive_hits.append(naive.ci_low <= truth <= naive.ci_high)
        # Then resampling prompts keeps ~95% coverage and resampling votes does not
        assert 0.9 <= np.mean(clustered_hits) <= 0.99
        assert np.mean(naive_hits) < 0.88


class TestLengthControlled:
    def simulate(self, length_effect, seed, n=4000, bias=0.0):
        rng = np.random.default_rng(seed)
        diffs = rng.normal(150, 200, n)  # the model tends to answer longer
        feature = np.tanh(diffs / diffs.std())
        p_win = 1 / (1 + np.exp(-(bias + length_effect * feature)))
        outcomes = np.where(rng.random(n) < p_win, "win", "loss").tolist()
        return outcomes, diffs

    def test_removes_a_pure_length_preference(self):
        outcomes, diffs = self.simulate(length_effect=1.5, seed=4)
        result = length_controlled_win_rate(outcomes, diffs, n_boot=100)
        assert result.raw_win_rate > 0.65
        assert result.win_rate == pytest.approx(0.5, abs=0.04)
        assert result.ci_low <= 0.5 <= result.ci_high
        assert result.length_coefficient == pytest.approx(1.5, abs=0.25)

    def test_matches_raw_rate_without_length_effect(self):
        outcomes, diffs = self.simulate(length_effect=0.0, seed=5, bias=0.8)
        result = length_controlled_win_rate(outcomes, diffs, n_boot=0)
        assert result.win_rate == pytest.approx(result.raw_win_rate, abs=0.03)

    def test_ties_count_half_and_both_bad_is_dropped(self):
        outcomes = ["win", "tie", "loss", "both_bad"]
        result = length_controlled_win_rate(outcomes, [0, 0, 0, 500], n_boot=0)
        # all kept length differences are zero: the fit is the raw rate (1 + 0.5) / 3
        assert result.n_votes == 3
        assert result.win_rate == pytest.approx(0.5, abs=1e-6)
