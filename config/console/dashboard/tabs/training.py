"""The Training page (and a run's own page): runs, curves of one run, its alarms."""

from __future__ import annotations

import numpy as np

from config.console.dashboard.data import read_metrics
from config.console.dashboard.panel import Panel, empty, number
from config.console.dashboard.specs import Curve, CurveAlarm, CurvesChart
from evaluation.stats import curves
from training.models import ModelVersion, TrainingRun

MAX_CURVE_POINTS = 1_000

# Logged keys of each curve, first match wins. Our PPO logs ``ppo/*``, ``kl/*``, ``score/*``;
# TRL's trainers (SFT, reward, DPO, GRPO, RLOO) log their own names; each tuple lists them all.
CURVE_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "score/raw_mean", "objective/scores", "objective/rlhf_reward"),
    "reward_std": ("reward_std", "score/raw_std"),
    "kl": ("kl/seq_mean", "kl", "objective/kl"),
    "entropy": ("entropy/rollout", "entropy", "ppo/entropy", "policy/entropy_avg"),
    "response_length": ("response/length_mean", "completions/mean_length", "response_length"),
    "loss": ("loss", "ppo/policy_loss", "loss/policy_avg"),
    "value_loss": ("value_loss", "ppo/value_loss", "loss/value_avg"),
    # DPO's implicit rewards beta * log(pi / pi_ref) of each answer (TRL DPOTrainer)
    "rewards_chosen": ("rewards/chosen",),
    "rewards_rejected": ("rewards/rejected",),
    "rewards_margins": ("rewards/margins",),
    "rewards_accuracies": ("rewards/accuracies",),
    # reward model (TRL RewardTrainer) and SFT
    "accuracy": ("accuracy",),
    "margin": ("margin",),
    "token_accuracy": ("mean_token_accuracy",),
    # the size of each policy update (our PPO; TRL GRPO/RLOO; TRL PPO)
    "clip_fraction": ("ppo/clip_fraction", "clip_ratio/region_mean", "policy/clipfrac_avg"),
    "approx_kl": ("ppo/approx_kl", "policy/approxkl_avg"),
    "grad_norm": ("ppo/policy_grad_norm", "grad_norm"),
    "value_grad_norm": ("ppo/value_grad_norm",),
    "learning_rate": ("learning_rate", "lr"),
}
# The curve each alarm kind is about (its label is drawn there; other curves get the line).
ALARM_METRICS = {
    "kl_limit": "kl",
    "kl_superlinear": "kl",
    "length_explosion": "response_length",
    "entropy_collapse": "entropy",
    "value_loss_spike": "value_loss",
}
# Alarms that mean something for a recipe. The reward-hacking signs (KL running away while
# reward rises, answers growing, entropy collapsing) belong to the recipes that sample answers
# and chase a reward; SFT, DPO and reward models lower their entropy by design and generate
# nothing, so only a metric that is not a number is an alarm there.
_SAMPLING_ALARMS = frozenset(
    {"non_finite", "kl_limit", "kl_superlinear", "length_explosion", "entropy_collapse"}
)
RECIPE_ALARMS: dict[str, frozenset[str]] = {
    "sft": frozenset({"non_finite"}),
    "reward": frozenset({"non_finite"}),
    "dpo": frozenset({"non_finite"}),
    "grpo": _SAMPLING_ALARMS,
    "rloo": _SAMPLING_ALARMS,
    "ppo": _SAMPLING_ALARMS | {"value_loss_spike"},
}
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
    allowed = RECIPE_ALARMS.get(run.recipe)
    alarms = [
        alarm
        for alarm in curves.training_alarms(records)
        if allowed is None or alarm.kind in allowed
    ]
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
        note=CURVE_NOTES.get(run.recipe, _HACKING)
        + " Thin lines are the logged values, thick ones a bias-corrected moving average "
        "(weight 0.6 on the past).",
    )
    if not alarms:
        return curves_panel_, empty("alarms", "Alarms", _no_alarm_message(allowed))
    alarm_rows = [[a.step, a.kind, a.reason] for a in alarms]
    return curves_panel_, Panel(
        key="alarms", title="Alarms", columns=["step", "kind", "why"], rows=alarm_rows
    )


def _no_alarm_message(allowed: frozenset[str] | None) -> str:
    if allowed is not None and allowed <= {"non_finite"}:
        return (
            "No alarm: every logged metric is a number. This recipe samples no answers, so "
            "the reward-hacking checks (KL, length, entropy) do not apply."
        )
    return "No alarm: KL, length, entropy and value loss look sane."
