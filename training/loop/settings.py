"""A project's loop policy and the recipe defaults the loop trains with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from annotation.models import LabelSource
from training.loop.mining import HARD_MINING_MODES


@dataclass
class LoopSettings:
    """A project's loop policy (stored as the kwargs of its beat schedule)."""

    path: str = field(default="dpo", metadata={"help": "'dpo' or 'rm_ppo'."})
    n_prompts: int = field(default=256, metadata={"help": "Prompts per new round."})
    k: int = field(default=2, metadata={"help": "Candidates per prompt (project's k)."})
    prompt_source: str = field(
        default="demo", metadata={"help": "'demo' (generated demo prompts) or 'pool' (project)."}
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
    min_new_judgments: int = field(
        default=0,
        metadata={
            "help": "Start an iteration once this many labels arrived (0: when "
            "the round is complete)."
        },
    )
    sources: list[str] = field(
        default_factory=lambda: [LabelSource.HUMAN, LabelSource.SIMULATED],
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

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> LoopSettings:
        """Build settings from a dict, rejecting unknown keys."""
        values = dict(values or {})
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown loop setting(s): {', '.join(sorted(unknown))}")
        settings = cls(**values)
        if settings.path not in ("dpo", "rm_ppo"):
            raise ValueError("path must be 'dpo' or 'rm_ppo'")
        if settings.hard_mining not in HARD_MINING_MODES:
            modes = ", ".join(repr(m) for m in HARD_MINING_MODES)
            raise ValueError(f"hard_mining must be one of {modes}")
        if not 0.0 <= settings.random_share <= 1.0:
            raise ValueError("random_share must be between 0 and 1")
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
    "kl_coef": 0.1,
    "target_kl": 1.5,
    "kl_horizon": 300,
    "normalize_score": False,
    "whiten_advantages": False,
    "max_new_tokens": 24,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 5,
}
