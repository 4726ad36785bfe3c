"""Training-curve smoothing and reward-hacking alarms on synthetic runs."""

import math

import numpy as np
import pytest

from evaluation.stats.curves import CurveThresholds, curve_series, smooth, training_alarms


def run(n=100, every=10, **overrides):
    """Return a healthy PPO-like log: reward saturating, KL ~ sqrt(step), stable length."""
    rows = []
    for k in range(1, n + 1):
        step = k * every
        row = {
            "step": step,
            "reward": 1 - math.exp(-step / 300),
            "kl": 0.15 * math.sqrt(step),
            "entropy": 2.0 - 0.3 * step / (n * every),
            "response_length": 200 + 10 * math.sin(step),
            "value_loss": 0.5 + 0.05 * math.cos(step),
        }
        for name, fn in overrides.items():
            row[name] = fn(step)
        rows.append(row)
    return rows


def kinds(alarms):
    return [a.kind for a in alarms]


class TestSmoothing:
    def test_debiased_ema_hand_computed(self):
        # w = 0.5: s1 = x1; s2 = (0.25 x1 + 0.5 x2) / 0.75
        assert smooth([4.0, 1.0], weight=0.5) == pytest.approx([4.0, (1 + 0.5) / 0.75])

    def test_constant_series_is_unchanged_and_nan_is_skipped(self):
        assert smooth([3.0, 3.0, float("nan"), 3.0], 0.9)[[0, 1, 3]] == pytest.approx([3.0] * 3)

    def test_series_sorted_by_step_and_missing_metrics_skipped(self):
        series = curve_series([{"step": 2, "reward": 1.0}, {"step": 1, "reward": 0.0, "kl": 0.1}])
        assert series["reward"].steps.tolist() == [1, 2]
        assert series["kl"].raw.tolist() == [0.1]
        assert "entropy" not in series


class TestAlarms:
    def test_healthy_run_raises_nothing(self):
        assert training_alarms(run()) == []

    def test_kl_exploding_while_reward_rises(self):
        # Given reward hacking from step 400: reward keeps climbing, KL grows quadratically
        def kl(step):
            return 0.15 * math.sqrt(step) + (0.0 if step < 400 else 2e-5 * (step - 400) ** 2)

        alarms = training_alarms(run(kl=kl, reward=lambda s: s / 1000))
        assert kinds(alarms) == ["kl_superlinear", "kl_limit"]
        superlinear, limit = alarms
        assert 400 < superlinear.step < limit.step
        assert "KL" in limit.reason and "above 6" in limit.reason

    def test_high_kl_with_flat_reward_is_not_reward_hacking(self):
        alarms = training_alarms(run(kl=lambda s: 8.0, reward=lambda s: 0.5))
        assert alarms == []

    def test_length_explosion(self):
        alarms = training_alarms(run(response_length=lambda s: 200 if s < 500 else 200 + s))
        assert kinds(alarms) == ["length_explosion"]
        assert alarms[0].step >= 500
        assert "2 x baseline 200" in alarms[0].reason

    def test_entropy_collapse(self):
        alarms = training_alarms(run(entropy=lambda s: 2.0 * math.exp(-s / 200)))
        assert kinds(alarms) == ["entropy_collapse"]
        # smoothed entropy falls below 0.6 shortly after 200 ln(1/0.3) ~ 241
        assert 240 <= alarms[0].step <= 300

    def test_value_loss_spike_and_non_finite(self):
        rows = run(value_loss=lambda s: 50.0 if s == 300 else 0.5)
        rows[50]["reward"] = float("nan")
        alarms = training_alarms(rows)
        assert [(a.kind, a.step) for a in alarms] == [
            ("value_loss_spike", 300),
            ("non_finite", 510),
        ]

    def test_thresholds_are_configurable(self):
        rows = run(response_length=lambda s: 200 if s < 500 else 350)
        assert training_alarms(rows) == []
        loose = CurveThresholds(length_ratio=1.5)
        assert kinds(training_alarms(rows, loose)) == ["length_explosion"]


def test_alarm_steps_are_logged_steps():
    rows = run(entropy=lambda s: 0.1)
    alarms = training_alarms(rows)
    steps = {row["step"] for row in rows}
    assert all(a.step in steps for a in alarms)
    assert np.all(np.diff([a.step for a in alarms]) >= 0)


class TestUpdateAndPreferenceAlarms:
    def test_update_size_fires_on_the_first_smoothed_clip_fraction_over_the_limit(self):
        # clip fraction 0.1 until step 500, then 0.6: the EMA (weight 0.6) crosses 0.3 at the
        # second point over (0.6 * ~0.1 + 0.4 * 0.6 = 0.30 at the first; the next is higher)
        rows = run(clip_fraction=lambda s: 0.1 if s < 500 else 0.6)
        alarms = [a for a in training_alarms(rows) if a.kind == "update_size"]
        assert len(alarms) == 1
        assert alarms[0].step in (500, 510) and "clip fraction" in alarms[0].reason

    def test_approx_kl_per_update_in_range_is_quiet(self):
        rows = run(approx_kl=lambda s: 0.02, clip_fraction=lambda s: 0.15)
        assert "update_size" not in kinds(training_alarms(rows))

    def test_chosen_log_probability_falling_is_likelihood_displacement(self):
        # baseline mean of the first 5 points is -50; the limit is 10 nats under it
        rows = [
            {"step": s, "chosen_logp": -50.0 - (0 if s <= 50 else (s - 50) * 0.5)}
            for s in range(10, 310, 10)
        ]
        alarms = training_alarms(rows)
        assert kinds(alarms) == ["likelihood_displacement"]
        smoothed = smooth([r["chosen_logp"] for r in rows])
        first = next(i for i, v in enumerate(smoothed) if v < -60.0)
        assert alarms[0].step == rows[first]["step"]

    def test_judge_falling_while_reward_rises_fires_and_judge_rising_does_not(self):
        falling = run(reward=lambda s: s / 1000, judge=lambda s: 1.0 - max(0, s - 300) / 500)
        rising = run(reward=lambda s: s / 1000, judge=lambda s: s / 2000)
        fired = [a for a in training_alarms(falling) if a.kind == "judge_falling"]
        assert len(fired) == 1 and fired[0].step > 300
        assert "judge_falling" not in kinds(training_alarms(rising))

    def test_a_judge_dip_inside_its_own_standard_error_is_no_alarm(self):
        # the judge falls 0.004 after step 300 while reward rises
        def judge(s):
            return 0.68 - (0.004 if s > 300 else 0.0)

        noisy = run(reward=lambda s: s / 1000, judge=judge, judge_sem=lambda s: 0.01)
        assert "judge_falling" not in kinds(training_alarms(noisy))
        # the same dip is an alarm for a judge whose noise is ten times smaller
        precise = run(reward=lambda s: s / 1000, judge=judge, judge_sem=lambda s: 0.001)
        assert "judge_falling" in kinds(training_alarms(precise))

    def test_judge_falling_needs_reward_rising(self):
        flat_reward = run(reward=lambda s: 0.5, judge=lambda s: 1.0 - s / 1000)
        assert "judge_falling" not in kinds(training_alarms(flat_reward))
