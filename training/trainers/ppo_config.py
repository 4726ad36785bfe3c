"""PPO recipe settings: the ``Config`` dataclass and the names of the files a run writes.

No Django here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training.trainers.common import BaseRecipeConfig, ConfigError

RECIPE = "ppo"
STATE_DIR = "ppo_state"
VALUE_HEAD_FILE = "value_head.pt"
SAMPLES_FILE = "samples.jsonl"
MISSING_EOS_CHOICES = ("penalty", "filter", "none")
SCORE_ORDER_CHOICES = ("normalize_then_clip", "clip_then_normalize")
PROMPT_FORMAT_CHOICES = ("auto", "chat", "plain")
VALUE_INIT_CHOICES = ("auto", "reward", "policy")
MIXED_PRECISION_CHOICES = ("auto", "no", "bf16")


@dataclass
class Config(BaseRecipeConfig):
    """PPO settings. Defaults follow InstructGPT (Ouyang et al. 2022) and Ziegler et al. 2019."""

    # Overridden base fields: one "step" here is one PPO update (rollout + optimisation).
    learning_rate: float = field(
        default=1e-5,
        metadata={
            "help": "Policy AdamW learning rate (InstructGPT used 9.65e-6 at 1.3B; tiny models "
            "need ~1e-4)."
        },
    )
    lr_scheduler_type: str = field(
        default="constant",
        metadata={
            "help": "Schedule of both learning rates over optimizer steps (transformers name)."
        },
    )
    max_steps: int = field(
        default=-1,
        metadata={
            "help": "PPO updates to run; -1 derives them from num_train_epochs passes over the "
            "training prompts."
        },
    )
    per_device_train_batch_size: int = field(
        default=8,
        metadata={"help": "Micro-batch: sequences per forward/backward pass in the PPO update."},
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={
            "help": "Micro-batches per optimizer step; a mini-batch is "
            "per_device_train_batch_size x gradient_accumulation_steps sequences."
        },
    )
    per_device_eval_batch_size: int = field(
        default=16,
        metadata={"help": "Sequences per forward pass when sampling and scoring rollouts."},
    )
    max_length: int | None = field(
        default=512,
        metadata={
            "help": "Maximum prompt + response tokens: prompts are cut from the left to "
            "max_length - max_new_tokens."
        },
    )
    logging_steps: int = field(
        default=1, metadata={"help": "Log metrics and fixed-prompt samples every N updates."}
    )
    save_steps: int = field(
        default=50, metadata={"help": "Write checkpoint-N (inference + resumable) every N updates."}
    )
    lora_target_modules: list[str] | str = field(
        default="all-linear",
        metadata={"help": "Policy modules that get adapters: a list of names or 'all-linear'."},
    )

    # Models.
    reference_model_path: str = field(
        default="",
        metadata={
            "help": "Frozen reference policy; empty uses model_name_or_path (the SFT policy). With "
            "LoRA and an empty value the reference is the base with adapters disabled."
        },
    )
    reward_model_path: str = field(
        default="",
        metadata={
            "help": "Frozen reward model folder (one-output sequence classifier from the reward "
            "recipe; scored with its own tokenizer). Exclusive with reward_function."
        },
    )
    reward_function: str = field(
        default="",
        metadata={
            "help": "Python reward 'module:function' called as f(prompt, response_text) -> "
            "float, e.g. 'training.demo:true_reward'. Exclusive with reward_model_path."
        },
    )
    reward_model_paths: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Reward model folders scored as one ensemble (every seed member of each "
            "counts once); the reward is mean - uncertainty_coef * std over the members (Coste "
            "et al. 2024, Reward Model Ensembles Help Mitigate Overoptimization). Give members "
            "trained alike (same data, different seeds): their scores are compared raw. "
            "Exclusive with reward_model_path and reward_function."
        },
    )
    uncertainty_coef: float = field(
        default=0.0,
        metadata={
            "help": "k of the ensemble reward mean - k * std (Coste et al. 2024 penalise the "
            "members' disagreement; std keeps the penalty in reward units). Applies to "
            "reward_model_paths and to a reward model saved with seed members; 0 = mean only."
        },
    )
    reward_calibration: dict[str, float] = field(
        default_factory=dict,
        metadata={
            "help": "The reward model version's frozen calibration: {'temperature', 'mean', "
            "'std'} (temperature fitted on held-out pairs, Guo et al. 2017; mean and std of the "
            "reward of the reference policy's answers, Ziegler et al. 2019 §2.2), optionally "
            "'model_version_id'. Scores become (r / temperature - mean) / std, fixed for the "
            "whole run instead of normalised on the fly. The loop fills it in."
        },
    )
    judge_reward_model_path: str = field(
        default="",
        metadata={
            "help": "A held-out judge: a reward model NOT used for training (e.g. trained on "
            "held-out labels) that scores greedy answers to the validation prompts every "
            "judge_every updates; the best-judged policy is kept as final (early stopping, "
            "Gao et al. 2023 show proxy and gold reward part ways as KL grows)."
        },
    )
    value_model_path: str = field(
        default="",
        metadata={
            "help": "Backbone folder of the critic (causal LM backbone + new scalar head); empty "
            "follows value_init."
        },
    )
    value_init: str = field(
        default="auto",
        metadata={
            "help": "Critic warm start when value_model_path is empty: 'reward' (RM backbone and "
            "head; needs the policy's tokenizer), 'policy' (SFT backbone, new head) or 'auto' "
            "(reward when possible, else policy)."
        },
    )
    value_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Critic AdamW learning rate; None uses learning_rate."},
    )
    disable_dropout: bool = field(
        default=True,
        metadata={
            "help": "Set every dropout of policy and critic to 0 so repeated forwards agree "
            "(ratio exactly 1 before the first step)."
        },
    )

    # Rollout.
    rollout_batch_size: int = field(
        default=64,
        metadata={"help": "Prompts per update per process; one response is sampled per prompt."},
    )
    prompt_format: str = field(
        default="auto",
        metadata={
            "help": "'auto' keeps each prompt as the data has it (messages through the chat "
            "template, text as is); 'chat' wraps text prompts as one user message; 'plain' "
            "joins message contents into text. Reward model and policy see the same form."
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature; log-probs and KL use the same tempered softmax."},
    )
    top_k: int = field(
        default=0,
        metadata={"help": "Top-k sampling (0 = off, the usual PPO choice)."},
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "Top-p sampling (1.0 = off, the usual PPO choice)."},
    )
    max_new_tokens: int = field(
        default=64, metadata={"help": "Maximum sampled tokens per response."}
    )
    stop_token_ids: list[int] = field(
        default_factory=list,
        metadata={"help": "Extra token ids that end a response besides the tokenizer's eos."},
    )
    missing_eos: str = field(
        default="penalty",
        metadata={
            "help": "Responses cut at max_new_tokens without a stop token: 'penalty' subtracts "
            "missing_eos_penalty from their score, 'filter' leaves them out of the loss, "
            "'none' treats them like any other."
        },
    )
    missing_eos_penalty: float = field(
        default=1.0,
        metadata={
            "help": "Subtracted from the score of a response without a stop token, after the "
            "score's normalisation and clipping (so in the units the policy sees)."
        },
    )

    # Reward shaping.
    kl_coef: float = field(
        default=0.1,
        metadata={
            "help": "Initial beta of the per-token -beta*KL reward (Ziegler 2019: 0.1-0.2; "
            "InstructGPT 0.02)."
        },
    )
    adaptive_kl: bool = field(
        default=True,
        metadata={"help": "Adapt beta towards target_kl (Ziegler et al. 2019 §2.2); else fixed."},
    )
    target_kl: float = field(
        default=6.0,
        metadata={"help": "Target KL per sequence (nats) of the adaptive controller (Ziegler: 6)."},
    )
    kl_horizon: int = field(
        default=10_000,
        metadata={"help": "Horizon of the adaptive controller in episodes (Ziegler: 10000)."},
    )
    kl_estimator: str = field(
        default="k1",
        metadata={
            "help": "Per-token KL in the reward: 'k1' = log pi - log pi_ref (Ziegler) or 'k3' "
            "(non-negative; joschu.net/blog/kl-approx.html)."
        },
    )
    normalize_score: bool = field(
        default=False,
        metadata={
            "help": "Standardise the score with the running mean/std of every raw score so far "
            "(this batch included): (s - mean) / std."
        },
    )
    score_clip: float | None = field(
        default=None,
        metadata={"help": "Clip the score to [-score_clip, score_clip]; None turns it off."},
    )
    score_transform_order: str = field(
        default="normalize_then_clip",
        metadata={
            "help": "Order of the score transforms: 'normalize_then_clip' or "
            "'clip_then_normalize'. Both act on the sequence score before the KL is added."
        },
    )
    whiten_rewards: bool = field(
        default=False,
        metadata={
            "help": "Rescale the shaped per-token rewards by their std over valid tokens (mean "
            "kept) before GAE."
        },
    )

    # Guards against reward hacking.
    ptx_coef: float = field(
        default=0.0,
        metadata={
            "help": "PPO-ptx (Ouyang et al. 2022, InstructGPT §3.5 eq. 2): add ptx_coef x the "
            "SFT loss (mean token NLL) of demonstrations to every micro-batch's loss. The "
            "demonstrations are the chosen answers of the snapshot's train split (a preference "
            "export; deduplicated); 0 = off."
        },
    )
    kl_budget: float | None = field(
        default=None,
        metadata={
            "help": "KL budget in nats per sequence: training stops when a rollout's mean "
            "sequence KL to the reference exceeds it, and the last policy measured under it "
            "becomes final (Gao et al. 2023: overoptimisation grows with KL). None = off."
        },
    )
    judge_every: int = field(
        default=5,
        metadata={"help": "Score the policy with the held-out judge every N updates."},
    )
    judge_patience: int = field(
        default=0,
        metadata={
            "help": "Stop after this many judge scores in a row without a new best "
            "(early stopping, Prechelt 1998); 0 = never stop, only keep the best."
        },
    )
    judge_prompts: int = field(
        default=64,
        metadata={"help": "Validation prompts the held-out judge scores (the first N)."},
    )

    # Advantages and update.
    gamma: float = field(default=1.0, metadata={"help": "Discount gamma (InstructGPT/TRL: 1)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (Schulman et al. 2016: 0.95)."})
    whiten_advantages: bool = field(
        default=True,
        metadata={"help": "Whiten advantages (mean and std over valid tokens, all processes)."},
    )
    num_ppo_epochs: int = field(
        default=4, metadata={"help": "Optimisation epochs over each rollout (Ziegler/TRL: 4)."}
    )
    cliprange: float = field(
        default=0.2, metadata={"help": "Policy ratio clip epsilon (Schulman et al. 2017: 0.2)."}
    )
    cliprange_value: float = field(
        default=0.2,
        metadata={"help": "Value clip around the rollout's values (OpenAI baselines ppo2)."},
    )
    vf_coef: float = field(
        default=0.1, metadata={"help": "Weight c_V of the value loss (TRL: 0.1)."}
    )
    entropy_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of the entropy bonus subtracted from the loss (0 = off)."},
    )

    # Logging, precision, resume.
    num_sample_prompts: int = field(
        default=4,
        metadata={
            "help": "Fixed prompts (the first training prompts) answered greedily and logged."
        },
    )
    mixed_precision: str = field(
        default="auto",
        metadata={"help": "'bf16', 'no' or 'auto' (bf16 when a GPU supports it) via accelerate."},
    )
    resume_from_checkpoint: str = field(
        default="",
        metadata={
            "help": "checkpoint-N folder to resume from (overrides resume, which takes the newest "
            "in the output folder)."
        },
    )

    def validate(self) -> None:
        """Raise ConfigError when the fields cannot work together."""
        super().validate()
        given = [bool(self.reward_model_path), bool(self.reward_model_paths)]
        if sum(given) + bool(self.reward_function) != 1:
            raise ConfigError(
                "give exactly one of reward_model_path, reward_model_paths and reward_function"
            )
        self._validate_guards()
        if self.reward_function and ":" not in self.reward_function:
            raise ConfigError("reward_function must look like 'package.module:function'")
        choices = {
            "missing_eos": (self.missing_eos, MISSING_EOS_CHOICES),
            "score_transform_order": (self.score_transform_order, SCORE_ORDER_CHOICES),
            "prompt_format": (self.prompt_format, PROMPT_FORMAT_CHOICES),
            "value_init": (self.value_init, VALUE_INIT_CHOICES),
            "mixed_precision": (self.mixed_precision, MIXED_PRECISION_CHOICES),
            "kl_estimator": (self.kl_estimator, ("k1", "k3")),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {value!r}")
        if self.temperature <= 0:
            raise ConfigError("temperature must be > 0 (PPO needs a sampling distribution)")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ConfigError("top_p must lie in (0, 1] and top_k must be >= 0")
        if self.max_new_tokens < 1 or self.rollout_batch_size < 1 or self.num_ppo_epochs < 1:
            raise ConfigError("max_new_tokens, rollout_batch_size and num_ppo_epochs must be >= 1")
        if self.max_length is not None and self.max_length <= self.max_new_tokens:
            raise ConfigError("max_length must leave room for the prompt beyond max_new_tokens")
        if self.adaptive_kl and (self.target_kl <= 0 or self.kl_horizon <= 0):
            raise ConfigError("the adaptive KL controller needs target_kl > 0 and kl_horizon > 0")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ConfigError("gamma and lam must lie in [0, 1]")
        if self.trl_args:
            raise ConfigError("trl_args does not apply to PPO (TRL 1.16 has no PPO trainer)")

    def _validate_guards(self) -> None:
        """Raise ConfigError when a reward-hacking guard is set up wrongly."""
        if not isinstance(self.reward_model_paths, list) or not all(
            isinstance(path, str) and path for path in self.reward_model_paths
        ):
            raise ConfigError("reward_model_paths must be a list of reward model folders")
        for name in ("uncertainty_coef", "ptx_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0")
        if self.uncertainty_coef and self.reward_function:
            raise ConfigError("uncertainty_coef needs reward models (an ensemble), not a function")
        if self.reward_calibration:
            calibration = self.reward_calibration
            if not isinstance(calibration, dict) or not {"temperature", "mean", "std"} <= set(
                calibration
            ):
                raise ConfigError("reward_calibration needs temperature, mean and std")
            extra = set(calibration) - {"temperature", "mean", "std", "model_version_id"}
            if extra:
                raise ConfigError(f"reward_calibration: unknown key(s) {sorted(extra)}")
            numbers = [calibration[k] for k in ("temperature", "mean", "std")]
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers):
                raise ConfigError("reward_calibration: temperature, mean and std must be numbers")
            if not (calibration["temperature"] > 0 and calibration["std"] > 0):
                raise ConfigError("reward_calibration: temperature and std must be > 0")
            if not self.reward_model_path:
                raise ConfigError("reward_calibration belongs to one reward_model_path")
            if self.normalize_score:
                raise ConfigError(
                    "reward_calibration is a frozen normalisation: turn normalize_score off"
                )
        if self.kl_budget is not None and not self.kl_budget > 0:
            raise ConfigError("kl_budget must be > 0 nats (or null for no budget)")
        if self.judge_every < 1 or self.judge_patience < 0 or self.judge_prompts < 1:
            raise ConfigError("judge_every and judge_prompts must be >= 1, judge_patience >= 0")
        rewards = {self.reward_model_path, *self.reward_model_paths} - {""}
        if self.judge_reward_model_path and self.judge_reward_model_path in rewards:
            raise ConfigError(
                "judge_reward_model_path must not be a reward model used for training"
            )

    @property
    def mini_batch_size(self) -> int:
        """Return the sequences per optimizer step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def sampling_settings(self) -> dict[str, Any]:
        """Return the sampling settings that define pi_old (recorded with every checkpoint)."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "repetition_penalty": 1.0,
        }

    def accelerate_mixed_precision(self) -> str:
        """Return accelerate's mixed precision: as configured, 'auto' is bf16 where supported."""
        if self.mixed_precision != "auto":
            return self.mixed_precision
        from training.trainers.common import use_bf16

        return "bf16" if use_bf16() else "no"
