"""The Training page (and a run's own page): runs, curves of one run, its alarms."""

from __future__ import annotations

import numpy as np

from config.console.dashboard.data import read_metrics
from config.console.dashboard.panel import Panel, empty, number
from config.console.dashboard.specs import Curve, CurveAlarm, CurvesChart
from evaluation.stats import curves
from training.alarms import ALARM_METRICS, CURVE_KEYS, RECIPE_ALARMS, canonical_metrics, run_alarms
from training.models import ModelVersion, TrainingRun

MAX_CURVE_POINTS = 1_000

CURVE_TITLES = {
    "reward": "Reward",
    "reward_std": "Reward spread (std)",
    "kl": "KL to the reference",
    "entropy": "Entropy",
    "response_length": "Response length",
    "loss": "Loss",
    "value_loss": "Value loss",
    "rewards_chosen": "Implicit reward, chosen",
    "rewards_rejected": "Implicit reward, rejected",
    "rewards_margins": "Implicit reward margin",
    "rewards_accuracies": "Preference accuracy",
    "accuracy": "Pair accuracy",
    "margin": "Score margin",
    "token_accuracy": "Token accuracy",
    "chosen_logp": "Log-probability of the chosen answers",
    "judge": "Held-out judge score",
    "clip_fraction": "Clip fraction",
    "approx_kl": "Approximate KL per update",
    "grad_norm": "Gradient norm",
    "value_grad_norm": "Value gradient norm",
    "learning_rate": "Learning rate",
}
_HACKING = (
    "Reward rising while the KL to the reference runs away, answers grow longer or entropy "
    "collapses is the reward-hacking pattern (Gao et al. 2023, Scaling Laws for Reward Model "
    "Overoptimization); dashed lines mark alarms."
)
CURVE_NOTES = {
    "sft": "Loss is the cross-entropy of the chosen answers' tokens (supervised fine-tuning, "
    "the first step of InstructGPT, Ouyang et al. 2022); token accuracy and entropy follow "
    "it. Entropy falls as the model imitates the answers, which is expected for SFT and "
    "raises no alarm.",
    "reward": "Loss is the pairwise Bradley-Terry loss of the reward model (Ouyang et al. 2022, "
    "InstructGPT); pair accuracy is the share of pairs scored the way annotators chose, and "
    "the score margin how far apart the two answers' scores are.",
    "dpo": "Implicit rewards are beta times the log-ratio of the policy to the reference for "
    "each answer (Rafailov et al. 2023, Direct Preference Optimization). The margin (chosen "
    "minus rejected) should grow and the preference accuracy (pairs with the chosen answer "
    "ahead) climb above 0.5; both rewards drifting down together is common.",
    "grpo": "Reward is the mean score of the sampled answers, normalised within each group "
    "(Shao et al. 2024, DeepSeekMath). " + _HACKING,
    "rloo": "Reward is the mean score of the sampled answers, each judged against the others "
    "for the same prompt (Ahmadian et al. 2024, Back to Basics). " + _HACKING,
    "ppo": "Clip fraction (share of tokens whose probability ratio left the clip range) and "
    "approximate KL per update show how far each update moved the policy (Schulman et al. "
    "2017, Proximal Policy Optimization; the KL estimator of Schulman 2020, Approximating KL "
    "Divergence). " + _HACKING,
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


def _thin(indices: int) -> np.ndarray:
    """Return the indices kept so a series has at most MAX_CURVE_POINTS points (ends kept)."""
    if indices <= MAX_CURVE_POINTS:
        return np.arange(indices)
    return np.unique(np.linspace(0, indices - 1, MAX_CURVE_POINTS).round().astype(int))


def curves_panel(run: TrainingRun) -> tuple[Panel, Panel]:
    """Return the run's curves (raw and smoothed) and its reward-hacking alarms."""
    logged = read_metrics(run)
    records, sources = canonical_metrics(logged)
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
    allowed = RECIPE_ALARMS.get(run.recipe)
    alarms = stored_alarms(run, logged)
    chart = CurvesChart(
        charts=charts,
        alarms=[CurveAlarm(a["step"], a["kind"], ALARM_METRICS.get(a["kind"], "")) for a in alarms],
    )
    curves_panel_ = Panel(
        key="curves",
        title=title,
        columns=["metric", "logged as", "step", "raw", "smoothed"],
        rows=rows,
        chart=chart,
        wide=True,
        show_table=False,
        note=CURVE_NOTES.get(run.recipe, _HACKING)
        + " Thin lines are the logged values, thick ones a bias-corrected moving average "
        "(weight 0.6 on the past).",
    )
    if not alarms:
        return curves_panel_, empty("alarms", "Alarms", _no_alarm_message(allowed))
    alarm_rows = [[a["step"], a["kind"], a["reason"], a.get("action", "")] for a in alarms]
    return curves_panel_, Panel(
        key="alarms",
        title="Alarms",
        columns=["step", "kind", "why", "action"],
        rows=alarm_rows,
        note="Computed by the run's supervisor as metrics arrive; 'stopped' means the run's "
        "config (stop_on_alarm) ended it there, keeping its newest complete checkpoint.",
    )


def stored_alarms(run: TrainingRun, records: list[dict]) -> list[dict]:
    """Return the alarms the supervisor stored on the run.

    Runs supervised before alarms were stored have none: theirs are computed from the same
    rules here, once, for display.
    """
    if run.alarms or run.status in (TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING):
        return list(run.alarms)
    if run.alarms_checked_at is not None:
        return []
    computed = run_alarms(run.recipe, records)
    return [{"step": a.step, "kind": a.kind, "reason": a.reason} for a in computed]


def _no_alarm_message(allowed: frozenset[str] | None) -> str:
    if allowed is not None and allowed <= {"non_finite"}:
        return (
            "No alarm: every logged metric is a number. This recipe samples no answers, so "
            "the reward-hacking checks (KL, length, entropy) do not apply."
        )
    return "No alarm: KL, length, entropy and value loss look sane."
