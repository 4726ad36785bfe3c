"""A project's loop policy and the recipe defaults the loop trains with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from annotation.models import LabelSource
from training.loop.mining import HARD_MINING_MODES

TRAIN_ROUNDS = ("all", "newest")


@dataclass
class LoopSettings:
    """A project's loop policy (stored on its `training.Loop` row).

    The defaults are a real project's: prompts from the project's pool, human labels only.
    `path` has no default: a project chooses how it learns. The arithmetic demo passes its own
    settings (demo prompts, simulated labels).
    """

    path: str = field(
        metadata={"help": "How each iteration learns: 'dpo' or 'rm_ppo' (no default)."}
    )
    n_prompts: int = field(default=256, metadata={"help": "Prompts per new round."})
    k: int = field(default=2, metadata={"help": "Candidates per prompt (project's k)."})
    prompt_source: str = field(
        default="pool",
        metadata={"help": "'pool' (the project's prompts) or 'demo' (arithmetic demo prompts)."},
    )
    hard_mining: str = field(
        default="",
        metadata={
            "help": "Hard-example mining: '' (none) | 'disagreement' (split labels) | "
            "'rm_margin' (small reward-model margin) | 'rm_disagreement' (the two newest "
            "reward models order answers differently) | 'human_rm' (humans vs the newest "
            "reward model)."
        },
    )
    random_share: float = field(
        default=0.5, metadata={"help": "Share of prompts always drawn at random when mining."}
    )
    mix_previous: bool = field(
        default=True, metadata={"help": "Pair the new policy's answers with the previous one's."}
    )
    train_rounds: str = field(
        default="all",
        metadata={
            "help": "Labels each iteration trains on: 'all' (every round so far, as Llama 2's "
            "reward models; Touvron et al. 2023, §3.2.2) or 'newest' (the newest round only: "
            "iterative DPO, each policy trained from the previous one on its own new pairs; "
            "Xu et al. 2023, 'Some things are more CRINGE than others'; Yuan et al. 2024, "
            "'Self-Rewarding Language Models')."
        },
    )
    min_new_judgments: int = field(
        default=0,
        metadata={
            "help": "Start an iteration once this many labels arrived (0: when "
            "the round is complete)."
        },
    )
    sources: list[str] = field(
        default_factory=lambda: [LabelSource.HUMAN.value],
        metadata={"help": "Label sources trained on (named explicitly, never mixed silently)."},
    )
    aggregation: str = field(default="majority", metadata={"help": "Export aggregation policy."})
    seed: int = field(default=0, metadata={"help": "Seed of prompt choice and generation."})
    generation: dict = field(
        default_factory=lambda: {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 24},
        metadata={"help": "GenerationSettings fields."},
    )
    dpo: dict = field(default_factory=dict, metadata={"help": "DPO recipe overrides."})
    reward: dict = field(default_factory=dict, metadata={"help": "Reward recipe overrides."})
    ppo: dict = field(default_factory=dict, metadata={"help": "PPO recipe overrides."})
    held_out_judge: bool = field(
        default=True,
        metadata={
            "help": "rm_ppo: also train a judge reward model on the labels the policy's reward "
            "model does not see (the export's validation and test splits). PPO keeps its "
            "best-judged checkpoint and the gate counts the judge's verdict."
        },
    )
    evaluation: dict = field(
        default_factory=dict,
        metadata={"help": "Evaluation of each new policy; keys and defaults: EVALUATION_DEFAULTS."},
    )
    gate: dict = field(
        default_factory=dict,
        metadata={"help": "Promotion gate criteria; keys and defaults: GATE_DEFAULTS."},
    )

    def __post_init__(self):
        # Fill every evaluation and gate key, so readers (the guards too) never guess.
        self.evaluation = evaluation_settings_check(self.evaluation)
        self.gate = gate_settings_check(self.gate)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> LoopSettings:
        """Build settings from a dict, rejecting unknown keys."""
        values = dict(values or {})
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown loop setting(s): {', '.join(sorted(unknown))}")
        if "path" not in values:
            raise ValueError("path must be chosen: 'dpo' or 'rm_ppo' (there is no default)")
        settings = cls(**values)
        if settings.path not in ("dpo", "rm_ppo"):
            raise ValueError("path must be 'dpo' or 'rm_ppo'")
        if settings.hard_mining not in HARD_MINING_MODES:
            modes = ", ".join(repr(m) for m in HARD_MINING_MODES)
            raise ValueError(f"hard_mining must be one of {modes}")
        if not 0.0 <= settings.random_share <= 1.0:
            raise ValueError("random_share must be between 0 and 1")
        if settings.train_rounds not in TRAIN_ROUNDS:
            raise ValueError("train_rounds must be 'all' or 'newest'")
        return settings

    def to_dict(self) -> dict:
        """Return the settings as the dict a beat schedule stores."""
        return asdict(self)


# Tuned on the demo domain's ~0.13M-parameter policy (benchmarks/loop_bench.py): at the TRL
# default lr (1e-6) or 5e-5 such a model does not move measurably; lr 2e-4 with beta 0.3
# drops rude answers without the likelihood collapse (both log-probs falling, garbled
# answers) that lr 5e-4 / beta 0.1 showed.
DPO_DEFAULTS = {
    "learning_rate": 2e-4,
    "beta": 0.3,
    "num_train_epochs": 3,
    "per_device_train_batch_size": 16,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 10,
}
REWARD_DEFAULTS = {
    # A seed ensemble: PPO trains on the members' mean minus uncertainty_coef x their std.
    "ensemble_size": 3,
    "learning_rate": 1e-3,
    "num_train_epochs": 3,
    "per_device_train_batch_size": 16,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 10,
}
# Tiny-model PPO (benchmarks/loop_bench.py): lr ~1e-4, a faster critic, 30 updates a round.
# The demo's reward model learns style, not arithmetic (correct-vs-wrong pairs at chance, the
# score of one answer with different numbers varies by ~0.005), so once answers are polite
# there is nothing left to learn. Raw scores and unwhitened advantages keep those rounds'
# updates as small as their signal; standardising either blew the noise up to full-size
# steps that eroded accuracy round after round (held-out 0.25 -> 0.12 with a standardised
# score; 0.29 -> 0.20 with whitened advantages, round-3 gain +0.17 to +0.21 vs +0.26 to +0.33).
PPO_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-4,
    "value_learning_rate": 1e-3,
    "max_steps": 30,
    "rollout_batch_size": 64,
    "per_device_train_batch_size": 16,
    "kl_coef": 0.13,
    "target_kl": 1.5,
    "kl_horizon": 300,
    "normalize_score": False,
    "whiten_advantages": False,
    "max_new_tokens": 24,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 5,
    # Guards against reward hacking (training.trainers.ppo_guards). The loop also passes the
    # reward model's frozen calibration and the gate's kl_budget. With a seed ensemble
    # (reward.ensemble_size > 1) PPO trains on mean - 1 std of the members (Coste et al.
    # 2024); the held-out judge is the loop's `held_out_judge` (on). PPO-ptx (ptx_coef, the
    # SFT loss of the export's chosen answers mixed into every policy update; Ouyang et al.
    # 2022 §3.5) is on: in the demo the reward models learn style and not arithmetic, and
    # without it each PPO round traded accuracy for style (held-out accuracy 0.29 -> 0.11 in
    # one round); with ptx_coef 1.0 accuracy held (0.29 -> 0.30) and the round-3 policy beat
    # SFT on every seed (benchmarks/loop_bench.py, guards on vs off).
    # The frozen calibration made the demo's scores ~1.27x the raw ones (T 0.71, std 1.11), and
    # at kl_coef 0.1 PPO on one round's reward model and data reached true reward -0.52 (seeds
    # 0-2: -0.508, -0.524, -0.527) against -0.44 on raw scores (-0.367, -0.493, -0.465); SFT
    # -0.572. Adam's steps do not depend on the reward's scale, so what the scale changed is the
    # score's weight against the KL penalty: kl_coef 0.13 (0.1 x 1.27) gives calibrated scores
    # the raw scores' balance (the adaptive controller then moves it the same way). Its loop
    # figure over seeds, guards on and off: benchmarks/loop_bench.py.
    "uncertainty_coef": 1.0,
    "ptx_coef": 1.0,
}


# How the loop evaluates each new policy (training.policy_eval).
EVALUATION_DEFAULTS: dict[str, Any] = {
    # Prompts of the pool's evaluation split answered by each policy (the demo: held-out ones).
    "n_prompts": 32,
    "seed": 0,
    # Temperature 1: the answers are samples of the policy itself, as the KL estimate needs.
    "temperature": 1.0,
    "max_new_tokens": 0,  # 0: the loop's generation max_new_tokens
    "reward_models": 1,  # how many of the project's newest reward models judge
    # {"endpoint": <declared endpoint name>, "model": <one of its models>} (optionally
    # "max_new_tokens" of the judge's replies), or None.
    "llm_judge": None,
    # Open a human evaluation round (new vs previous) on the evaluation prompts.
    "human_round": False,
}

# The promotion gate (training.loop.gate). `kl_budget` is the one home of the KL budget: the
# reward-hacking guards read it from here.
GATE_DEFAULTS: dict[str, Any] = {
    # Lower end of the 95% prompt-clustered CI of the win rate vs the previous promoted
    # policy, for every judge in `win_rate_judges` that evaluated it (None: not checked).
    "min_win_rate_ci_low": 0.5,
    # The demo's programmatic reward stays a report: the gate does not read it by default.
    "win_rate_judges": ["reward_model", "llm", "human"],
    # The loop's held-out judge (`LoopSettings.held_out_judge`) learns from a fifth of the
    # labels, so it is weaker than the reward model PPO chased and is asked a weaker question:
    # is the new policy clearly worse than the previous promoted one? The upper end of its 95%
    # CI of the win rate must reach this (a non-inferiority check; None: report only).
    "held_out_judge_min_win_rate_ci_high": 0.5,
    # Sequence-level KL (nats) of the new policy to its reference (its parent). A generous
    # default: a project should set its own.
    "kl_budget": 20.0,
    # Mean answer length of the new policy over the previous one's (length hacking).
    "max_length_ratio": 2.0,
    # Held-out (test split) accuracy of the reward model trained in the iteration (rm_ppo).
    "min_rm_accuracy": 0.5,
}
JUDGE_KINDS = ("reward_model", "llm", "human", "programmatic")


def _merged(values: Any, defaults: dict[str, Any], name: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise ValueError(f"{name} must be an object")
    unknown = set(values) - set(defaults)
    if unknown:
        raise ValueError(f"unknown {name} setting(s): {', '.join(sorted(unknown))}")
    return {**defaults, **values}


def _number_or_none(values: dict, key: str, name: str, *, low: float = 0.0) -> None:
    value = values[key]
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise ValueError(f"{name}.{key} must be a number >= {low:g} or null")


def evaluation_settings_check(values: Any) -> dict[str, Any]:
    """Return the evaluation settings with defaults filled in; raise ValueError naming a key."""
    merged = _merged(values, EVALUATION_DEFAULTS, "evaluation")
    for key in ("n_prompts", "reward_models", "max_new_tokens", "seed"):
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"evaluation.{key} must be a whole number >= 0")
    if merged["n_prompts"] < 1:
        raise ValueError("evaluation.n_prompts must be at least 1")
    _number_or_none(merged, "temperature", "evaluation")
    judge = merged["llm_judge"]
    if judge is not None and (
        not isinstance(judge, dict)
        or not {"endpoint", "model"} <= set(judge) <= {"endpoint", "model", "max_new_tokens"}
        or not all(isinstance(judge[k], str) and judge[k] for k in ("endpoint", "model"))
        or not isinstance(judge.get("max_new_tokens", 1), int)
        or judge.get("max_new_tokens", 1) < 1
    ):
        raise ValueError(
            'evaluation.llm_judge must be null or {"endpoint": <declared endpoint name>, '
            '"model": <one of its models>, optionally "max_new_tokens": <whole number>}'
        )
    if not isinstance(merged["human_round"], bool):
        raise ValueError("evaluation.human_round must be true or false")
    return merged


def gate_settings_check(values: Any) -> dict[str, Any]:
    """Return the gate criteria with defaults filled in; raise ValueError naming a key."""
    merged = _merged(values, GATE_DEFAULTS, "gate")
    for key in (
        "min_win_rate_ci_low",
        "held_out_judge_min_win_rate_ci_high",
        "kl_budget",
        "max_length_ratio",
        "min_rm_accuracy",
    ):
        _number_or_none(merged, key, "gate")
    judges = merged["win_rate_judges"]
    if not isinstance(judges, list) or not set(judges) <= set(JUDGE_KINDS):
        raise ValueError(f"gate.win_rate_judges must be a list of: {', '.join(JUDGE_KINDS)}")
    return merged
