"""Reward-hacking alarms of a training run: which logged keys feed them, which apply to a recipe,
and which stop the run. One home for the supervisor (which computes them as metrics arrive and
stores them on the run) and the dashboard (which shows what is stored).

The rules themselves are pure statistics in ``evaluation.stats.curves``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from evaluation.stats import curves

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
    # DPO: the policy's log-probability of the chosen answers (TRL DPOTrainer)
    "chosen_logp": ("logps/chosen",),
    # a held-out judge's mean score of the policy's answers, when the recipe logs one
    "judge": ("judge/score_mean", "eval/judge_score"),
    # its standard error over the prompts it scored: the judge's own noise
    "judge_sem": ("judge/score_sem",),
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
    "update_size": "clip_fraction",
    "likelihood_displacement": "chosen_logp",
    "judge_falling": "judge",
}
# Alarms that mean something for a recipe. The reward-hacking signs (KL running away while
# reward rises, answers growing, entropy collapsing, a held-out judge falling) belong to the
# recipes that sample answers and chase a reward; SFT, DPO and reward models lower their
# entropy by design and generate nothing. DPO has its own failure: the chosen answers' own
# probability falling.
_SAMPLING_ALARMS = frozenset(
    {
        "non_finite",
        "kl_limit",
        "kl_superlinear",
        "length_explosion",
        "entropy_collapse",
        "update_size",
        "judge_falling",
    }
)
RECIPE_ALARMS: dict[str, frozenset[str]] = {
    "sft": frozenset({"non_finite"}),
    "reward": frozenset({"non_finite"}),
    "dpo": frozenset({"non_finite", "likelihood_displacement"}),
    "grpo": _SAMPLING_ALARMS,
    "rloo": _SAMPLING_ALARMS,
    "ppo": _SAMPLING_ALARMS | {"value_loss_spike"},
}
ALARM_KINDS = frozenset().union(*RECIPE_ALARMS.values(), {"value_loss_spike"})


def _finite(value: Any) -> bool:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def canonical_metrics(records: Iterable[Mapping]) -> tuple[list[dict], dict[str, str]]:
    """Return records renamed to the curve names, and which logged key each came from.

    A non-finite value is kept (it is the ``non_finite`` alarm), but a key counts as the
    source of a curve only when it has some finite value.
    """
    records = [r for r in records if "step" in r]
    sources: dict[str, str] = {}
    for name, keys in CURVE_KEYS.items():
        for key in keys:
            if any(_finite(r.get(key)) for r in records):
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


def run_alarms(recipe: str, records: Iterable[Mapping]) -> list[curves.Alarm]:
    """Return the alarms of a run's logged metrics that apply to its recipe, by step."""
    canonical, _sources = canonical_metrics(records)
    if not canonical:
        return []
    allowed = RECIPE_ALARMS.get(recipe)
    return [a for a in curves.training_alarms(canonical) if allowed is None or a.kind in allowed]


def stop_kinds(recipe: str, config: Mapping[str, Any]) -> frozenset[str]:
    """Return the alarm kinds that stop this run (the config's ``stop_on_alarm``).

    ``true`` stops on every alarm of the recipe, a list on the kinds it names, absent or
    ``false`` on none (alarms are then recorded only).
    """
    value = config.get("stop_on_alarm")
    allowed = RECIPE_ALARMS.get(recipe, ALARM_KINDS)
    if value is True:
        return allowed
    if isinstance(value, list | tuple):
        return frozenset(value) & allowed
    return frozenset()


def stop_on_alarm_check(value: Any) -> str | None:
    """Return what is wrong with a ``stop_on_alarm`` value, or None."""
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return "expected true, false or a list of alarm kinds."
    unknown = sorted(set(value) - ALARM_KINDS)
    if unknown:
        known = ", ".join(sorted(ALARM_KINDS))
        return f"unknown alarm kind(s) {', '.join(unknown)}; known: {known}."
    return None


def alarm_record(alarm: curves.Alarm, *, action: str = "recorded") -> dict[str, Any]:
    """Return an alarm as stored on the run."""
    return {"step": alarm.step, "kind": alarm.kind, "reason": alarm.reason, "action": action}
