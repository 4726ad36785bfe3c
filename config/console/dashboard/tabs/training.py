"""The Training page (and a run's own page): runs, curves of one run, its alarms."""

from __future__ import annotations

import numpy as np

from config.console.dashboard.data import read_metrics
from config.console.dashboard.panel import Panel, empty, number
from config.console.dashboard.specs import Curve, CurveAlarm, CurvesChart
from evaluation.stats import curves
from training.models import ModelVersion, TrainingRun

MAX_CURVE_POINTS = 1_000

# Logged keys of each curve, first match wins (our PPO, TRL GRPO/RLOO, TRL PPO, SFT/DPO/RM).
CURVE_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "score/raw_mean", "objective/scores", "objective/rlhf_reward"),
    "kl": ("kl/seq_mean", "kl", "objective/kl"),
    "entropy": ("entropy/rollout", "entropy", "ppo/entropy", "policy/entropy_avg"),
    "response_length": ("response/length_mean", "completions/mean_length", "response_length"),
    "loss": ("loss", "ppo/policy_loss", "loss/policy_avg"),
    "value_loss": ("value_loss", "ppo/value_loss", "loss/value_avg"),
}
# The curve each alarm kind is about (its label is drawn there; other curves get the line).
ALARM_METRICS = {
    "kl_limit": "kl",
    "kl_superlinear": "kl",
    "length_explosion": "response_length",
    "entropy_collapse": "entropy",
    "value_loss_spike": "value_loss",
}
CURVE_TITLES = {
    "reward": "Reward",
    "kl": "KL to the reference",
    "entropy": "Entropy",
    "response_length": "Response length",
    "loss": "Loss",
    "value_loss": "Value loss",
}


def runs_panel(runs: list[TrainingRun]) -> Panel:
    """Return the training runs: recipe, status, progress, model made."""
    rows = []
    for run in runs:
        try:
            version = run.model_version.name
        except ModelVersion.DoesNotExist:
            version = None
        rows.append(
            [
                run.pk,
                run.recipe,
                run.status,
                run.progress,
                version,
                run.created_at.strftime("%Y-%m-%d %H:%M"),
                run.finished_at.strftime("%Y-%m-%d %H:%M") if run.finished_at else None,
            ]
        )
    if not rows:
        return empty("runs", "Training runs", "No training runs yet.")
    return Panel(
        key="runs",
        title="Training runs",
        columns=["run", "recipe", "status", "progress", "model", "created", "finished"],
        rows=rows,
    )


def canonical_metrics(records: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """Return records renamed to the curve names, and which logged key each came from."""
    sources: dict[str, str] = {}
    for name, keys in CURVE_KEYS.items():
        for key in keys:
            if any(number(r.get(key)) is not None for r in records):
                sources[name] = key
                break
    out = []
    for record in records:
        row = {"step": record["step"]}
        for name, key in sources.items():
            if key in record and isinstance(record[key], int | float):
                row[name] = float(record[key])
        if len(row) > 1:
            out.append(row)
    return out, sources


def _thin(indices: int) -> np.ndarray:
    """Return the indices kept so a series has at most MAX_CURVE_POINTS points (ends kept)."""
    if indices <= MAX_CURVE_POINTS:
        return np.arange(indices)
    return np.unique(np.linspace(0, indices - 1, MAX_CURVE_POINTS).round().astype(int))


def curves_panel(run: TrainingRun) -> tuple[Panel, Panel]:
    """Return the run's curves (raw and smoothed) and its reward-hacking alarms."""
    records, sources = canonical_metrics(read_metrics(run))
    title = f"Training curves: run {run.pk} ({run.recipe})"
    if not records:
        message = "No metrics logged yet." if run.output_dir else "The run has no output folder."
        return empty("curves", title, message), empty("alarms", "Alarms", "No metrics to check.")
    series = curves.curve_series(records)
    for name in CURVE_KEYS:  # the library smooths its alarm metrics; the rest alike here
        points = sorted((r["step"], r[name]) for r in records if name in r)
        if name not in series and points:
            raw = np.array([p[1] for p in points], dtype=float)
            steps = np.array([p[0] for p in points], dtype=float)
            series[name] = curves.Series(steps, raw, curves.smooth(raw))
    rows = []
    charts = []
    for name in CURVE_KEYS:
        if name not in series:
            continue
        s = series[name]
        points = []
        for i in _thin(len(s.steps)):
            raw, smoothed = number(s.raw[i]), number(s.smoothed[i])
            rows.append([name, sources[name], int(s.steps[i]), raw, smoothed])
            points.append([int(s.steps[i]), raw, smoothed])
        charts.append(Curve(name, CURVE_TITLES[name], sources[name], points))
    alarms = curves.training_alarms(records)
    chart = CurvesChart(
        charts=charts,
        alarms=[CurveAlarm(a.step, a.kind, ALARM_METRICS.get(a.kind, "")) for a in alarms],
    )
    curves_panel_ = Panel(
        key="curves",
        title=title,
        columns=["metric", "logged as", "step", "raw", "smoothed"],
        rows=rows,
        chart=chart,
        wide=True,
        show_table=False,
        note="Read together: reward rising with KL exploding, length growing "
        "or entropy collapsing is the reward-hacking pattern. Smoothing: debiased EMA 0.6. "
        "Dashed lines mark alarms.",
    )
    if not alarms:
        return curves_panel_, empty(
            "alarms", "Alarms", "No alarm: KL, length, entropy and value loss look sane."
        )
    alarm_rows = [[a.step, a.kind, a.reason] for a in alarms]
    return curves_panel_, Panel(
        key="alarms", title="Alarms", columns=["step", "kind", "why"], rows=alarm_rows
    )
