"""Policy-training curves: smoothed series and reward-hacking alarms. Numpy/scipy, no Django.

Input is the list of logged metric dicts with ``step`` and any of ``reward``, ``kl``,
``entropy``, ``response_length``, ``value_loss``, ``clip_fraction``, ``approx_kl``,
``chosen_logp`` (DPO: log-probability of the chosen answers) and ``judge`` (a held-out judge's
score of the policy's answers). Each alarm names the first step where its rule fired and says
why, with the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

METRICS = (
    "reward",
    "kl",
    "entropy",
    "response_length",
    "value_loss",
    "clip_fraction",
    "approx_kl",
    "chosen_logp",
    "judge",
    "judge_sem",
)


@dataclass(frozen=True)
class Alarm:
    """One alarm: where it fired, which rule, and why."""

    step: int
    kind: str
    reason: str


@dataclass(frozen=True)
class Series:
    """One metric's steps, raw values and smoothed values."""

    steps: np.ndarray
    raw: np.ndarray
    smoothed: np.ndarray


@dataclass(frozen=True)
class CurveThresholds:
    """Limits for ``training_alarms``."""

    smoothing: float = field(default=0.6, metadata={"help": "EMA weight of the past, 0..1"})
    kl_limit: float = field(default=6.0, metadata={"help": "KL above this with rising reward"})
    window: int = field(default=10, metadata={"help": "logged points per trend window"})
    reward_alpha: float = field(
        default=0.05, metadata={"help": "one-sided level for 'reward is rising'"}
    )
    superlinear_exponent: float = field(
        default=1.5, metadata={"help": "alarm when KL ~ step^p with p above this"}
    )
    kl_floor: float = field(
        default=0.5, metadata={"help": "ignore KL growth while KL is below this"}
    )
    baseline_points: int = field(default=5, metadata={"help": "first points as baseline"})
    length_ratio: float = field(default=2.0, metadata={"help": "length over baseline ratio"})
    entropy_ratio: float = field(default=0.3, metadata={"help": "entropy under baseline ratio"})
    value_loss_ratio: float = field(
        default=10.0, metadata={"help": "value loss over its running median"}
    )
    clip_fraction_limit: float = field(
        default=0.3, metadata={"help": "smoothed clip fraction above this: updates too large"}
    )
    approx_kl_limit: float = field(
        default=0.1, metadata={"help": "smoothed approximate KL per update above this"}
    )
    chosen_logp_drop: float = field(
        default=10.0,
        metadata={"help": "chosen answers' log-probability this many nats under its baseline"},
    )
    judge_drop: float = field(
        default=0.0, metadata={"help": "judge score under its baseline by more than this"}
    )
    judge_sems: float = field(
        default=2.0,
        metadata={
            "help": "... and by more than this many standard errors of the baseline's judge "
            "score (when the run logs them): a dip inside the judge's own noise is no alarm"
        },
    )


def smooth(values: Iterable[float], weight: float = 0.6) -> np.ndarray:
    """Return the bias-corrected exponential moving average (TensorBoard's smoothing)."""
    data = np.asarray(list(values), dtype=float)
    out = np.empty_like(data)
    average, norm = 0.0, 0.0
    for i, value in enumerate(data):
        if not math.isfinite(value):
            out[i] = np.nan
            continue
        # Debiased EMA, as in Adam (Kingma & Ba 2015, alg. 1): m_t / (1 - w^t)
        average = weight * average + (1 - weight) * value
        norm = weight * norm + (1 - weight)
        out[i] = average / norm
    return out


def curve_series(
    metrics: Iterable[Mapping[str, float]], smoothing: float = 0.6
) -> dict[str, Series]:
    """Return each metric present in the logs as a step-sorted Series with its smoothing."""
    rows = sorted((m for m in metrics if "step" in m), key=lambda m: m["step"])
    result: dict[str, Series] = {}
    for name in METRICS:
        points = [(r["step"], r[name]) for r in rows if r.get(name) is not None]
        if not points:
            continue
        steps = np.array([p[0] for p in points], dtype=float)
        raw = np.array([p[1] for p in points], dtype=float)
        result[name] = Series(steps, raw, smooth(raw, smoothing))
    return result


def _trend(steps: np.ndarray, values: np.ndarray) -> float:
    """Return the least-squares slope of values over steps."""
    if steps.size < 2 or np.ptp(steps) == 0:
        return 0.0
    return float(np.polyfit(steps, values, 1)[0])


def _reward_rising(
    series: dict[str, Series], step: float, t: CurveThresholds
) -> tuple[bool, float]:
    """Return whether reward rose significantly over the window ending at ``step``, and how much.

    Rising means a positive least-squares slope of the raw reward on step with one-sided
    p < ``reward_alpha`` over the last ``window`` logs; the gain is slope times window span.
    """
    reward = series.get("reward")
    if reward is None:
        return False, 0.0
    upto = reward.steps <= step
    steps, values = reward.steps[upto][-t.window :], reward.raw[upto][-t.window :]
    ok = np.isfinite(values)
    if ok.sum() < 3 or np.ptp(steps[ok]) == 0:
        return False, 0.0
    if np.ptp(values[ok]) == 0:
        return False, 0.0
    fit = stats.linregress(steps[ok], values[ok])
    one_sided = fit.pvalue / 2 if fit.slope > 0 else 1.0
    return bool(one_sided < t.reward_alpha), float(fit.slope * np.ptp(steps[ok]))


def training_alarms(
    metrics: Iterable[Mapping[str, float]], thresholds: CurveThresholds | None = None
) -> list[Alarm]:
    """Return the first alarm of each kind, sorted by step.

    Kinds: ``kl_limit`` (smoothed KL above the limit while reward rises), ``kl_superlinear``
    (KL growing like step^p, p above the exponent, over the last window while reward rises),
    ``length_explosion``, ``entropy_collapse``, ``value_loss_spike``, ``non_finite``,
    ``update_size`` (clip fraction or approximate KL per update above its limit),
    ``likelihood_displacement`` (DPO: the chosen answers' log-probability falling) and
    ``judge_falling`` (reward rising while a held-out judge's score falls).
    """
    t = thresholds or CurveThresholds()
    series = curve_series(metrics, t.smoothing)
    alarms: list[Alarm] = []
    alarms += _non_finite(series)
    alarms += _kl_alarms(series, t)
    alarms += _ratio_alarm(
        series.get("response_length"), t, above=True, kind="length_explosion", label="length"
    )
    alarms += _ratio_alarm(
        series.get("entropy"), t, above=False, kind="entropy_collapse", label="entropy"
    )
    alarms += _value_loss_spike(series.get("value_loss"), t)
    alarms += _update_size(series, t)
    alarms += _likelihood_displacement(series.get("chosen_logp"), t)
    alarms += _judge_falling(series, t)
    return sorted(alarms, key=lambda a: a.step)


def _update_size(series: dict[str, Series], t: CurveThresholds) -> list[Alarm]:
    """Flag the first update whose smoothed clip fraction or approximate KL is over its limit.

    PPO keeps each update inside a trust region (Schulman et al. 2017, Proximal Policy
    Optimization); a clip fraction or a per-update KL far above the usual range (a few
    percent; implementations stop an epoch early near 0.01-0.05 KL) means steps too large.
    """
    found = []
    for name, limit in (("clip_fraction", t.clip_fraction_limit), ("approx_kl", t.approx_kl_limit)):
        s = series.get(name)
        if s is None:
            continue
        over = np.isfinite(s.smoothed) & (s.smoothed > limit)
        if over.any():
            i = int(np.argmax(over))
            found.append((s.steps[i], name, s.smoothed[i], limit))
    if not found:
        return []
    step, name, value, limit = min(found)
    label = name.replace("_", " ")
    return [Alarm(int(step), "update_size", f"{label} {value:.3g} above {limit:g} per update")]


def _likelihood_displacement(s: Series | None, t: CurveThresholds) -> list[Alarm]:
    """Flag DPO lowering the log-probability of the chosen answers themselves.

    DPO widens the gap between chosen and rejected answers; when it does so by pushing the
    chosen answers' probability down, probability mass moves to answers nobody labelled
    (Razin et al. 2024, Unintentional Unalignment: Likelihood Displacement in Direct
    Preference Optimization; Pal et al. 2024, Smaug).
    """
    if s is None or s.raw.size <= t.baseline_points:
        return []
    head = s.raw[: t.baseline_points]
    if not np.isfinite(head).any():
        return []
    baseline = float(np.mean(head[np.isfinite(head)]))
    limit = baseline - t.chosen_logp_drop
    for step, value in zip(s.steps, s.smoothed, strict=True):
        if math.isfinite(value) and value < limit:
            return [
                Alarm(
                    int(step),
                    "likelihood_displacement",
                    f"chosen answers' log-probability {value:.3g} fell more than "
                    f"{t.chosen_logp_drop:g} under its baseline {baseline:.3g}",
                )
            ]
    return []


def _judge_falling(series: dict[str, Series], t: CurveThresholds) -> list[Alarm]:
    """Flag reward rising while a held-out judge's score of the same policy falls.

    The trained reward is a proxy; a judge it was not trained against falling while the proxy
    climbs is over-optimisation itself (Gao et al. 2023, Scaling Laws for Reward Model
    Overoptimization).
    """
    judge = series.get("judge")
    if judge is None or judge.raw.size <= t.baseline_points:
        return []
    head = judge.raw[: t.baseline_points]
    if not np.isfinite(head).any():
        return []
    baseline = float(np.mean(head[np.isfinite(head)]))
    drop = t.judge_drop
    sem = series.get("judge_sem")
    if sem is not None:
        sem_head = sem.raw[: t.baseline_points]
        if np.isfinite(sem_head).any():
            drop = max(drop, t.judge_sems * float(np.mean(sem_head[np.isfinite(sem_head)])))
    for i, step in enumerate(judge.steps):
        value = judge.smoothed[i]
        if i + 1 < t.baseline_points or not math.isfinite(value):
            continue
        if value >= baseline - drop:
            continue
        lo = max(0, i + 1 - t.window)
        if _trend(judge.steps[lo : i + 1], judge.smoothed[lo : i + 1]) >= 0:
            continue
        rising, gain = _reward_rising(series, step, t)
        if rising:
            return [
                Alarm(
                    int(step),
                    "judge_falling",
                    f"held-out judge {value:.3g} under its baseline {baseline:.3g} while "
                    f"reward rose {gain:+.3g} over the last {t.window} logs",
                )
            ]
    return []


def _non_finite(series: dict[str, Series]) -> list[Alarm]:
    """Flag the first NaN or infinite value across all metrics."""
    found = [
        (s.steps[~np.isfinite(s.raw)][0], name)
        for name, s in series.items()
        if (~np.isfinite(s.raw)).any()
    ]
    if not found:
        return []
    step, name = min(found)
    return [Alarm(int(step), "non_finite", f"{name} is not finite at step {int(step)}")]


def _kl_alarms(series: dict[str, Series], t: CurveThresholds) -> list[Alarm]:
    """Flag KL above its limit, or growing super-linearly, while reward rises."""
    kl = series.get("kl")
    if kl is None:
        return []
    alarms: list[Alarm] = []
    limit_fired = superlinear_fired = False
    for i, step in enumerate(kl.steps):
        value = kl.smoothed[i]
        if not math.isfinite(value):
            continue
        rising, gain = _reward_rising(series, step, t)
        if not rising:
            continue
        if not limit_fired and value > t.kl_limit:
            limit_fired = True
            alarms.append(
                Alarm(
                    int(step),
                    "kl_limit",
                    f"KL {value:.3g} above {t.kl_limit:g} while reward rose {gain:+.3g}"
                    f" over the last {t.window} logs",
                )
            )
        if not superlinear_fired and i + 1 >= t.window and value > t.kl_floor:
            steps = kl.steps[i + 1 - t.window : i + 1]
            values = kl.smoothed[i + 1 - t.window : i + 1]
            ok = np.isfinite(values) & (values > 0) & (steps > 0)
            if ok.sum() >= 3:
                # growth exponent p of KL ~ c * step^p: slope of log KL on log step
                exponent = _trend(np.log(steps[ok]), np.log(values[ok]))
                if exponent > t.superlinear_exponent:
                    superlinear_fired = True
                    alarms.append(
                        Alarm(
                            int(step),
                            "kl_superlinear",
                            f"KL {value:.3g} growing like step^{exponent:.2f} (limit"
                            f" {t.superlinear_exponent:g}) while reward rose {gain:+.3g}",
                        )
                    )
        if limit_fired and superlinear_fired:
            break
    return alarms


def _ratio_alarm(
    s: Series | None, t: CurveThresholds, *, above: bool, kind: str, label: str
) -> list[Alarm]:
    """Flag the first smoothed value beyond a ratio of the baseline (mean of first points)."""
    if s is None or s.raw.size <= t.baseline_points:
        return []
    head = s.raw[: t.baseline_points]
    baseline = float(np.mean(head[np.isfinite(head)])) if np.isfinite(head).any() else math.nan
    if not math.isfinite(baseline) or baseline <= 0:
        return []
    ratio = t.length_ratio if above else t.entropy_ratio
    limit = baseline * ratio
    for step, value in zip(s.steps, s.smoothed, strict=True):
        if math.isfinite(value) and (value > limit if above else value < limit):
            direction = "above" if above else "below"
            return [
                Alarm(
                    int(step),
                    kind,
                    f"{label} {value:.3g} {direction} {ratio:g} x baseline {baseline:.3g}",
                )
            ]
    return []


def _value_loss_spike(s: Series | None, t: CurveThresholds) -> list[Alarm]:
    """Flag the first raw value loss above a multiple of the median of earlier values."""
    if s is None:
        return []
    for i in range(t.baseline_points, s.raw.size):
        earlier = s.raw[:i][np.isfinite(s.raw[:i])]
        value = s.raw[i]
        if earlier.size and math.isfinite(value):
            median = float(np.median(earlier))
            if median > 0 and value > t.value_loss_ratio * median:
                return [
                    Alarm(
                        int(s.steps[i]),
                        "value_loss_spike",
                        f"value loss {value:.3g} over {t.value_loss_ratio:g} x running"
                        f" median {median:.3g}",
                    )
                ]
    return []
