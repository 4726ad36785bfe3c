"""Online RL recipes: GRPO and RLOO on prompts, scored by a reward model or a Python function.

Both wrap TRL's trainers (``GRPOTrainer``, ``RLOOTrainer``): the policy samples
``num_generations`` completions per prompt, the reward is computed for each, and the
advantage is the reward relative to the other completions of the same prompt.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.trainers.common import (
    BaseRecipeConfig,
    ConfigError,
    attach_logger,
    check_local_dir,
    final_evaluation,
    finish_run,
    lora_config,
    make_trl_config,
    resume_checkpoint,
    start_run,
    trainer_kwargs,
)
from training.trainers.data import load_prompts
from training.trainers.dpo import load_policy_tokenizer
from training.trainers.run_log import RunLogger

SCORING_CHOICES = ("prefloop", "trl")


@dataclass
class OnlineConfig(BaseRecipeConfig):
    """Settings shared by GRPO and RLOO."""

    learning_rate: float = field(default=1e-6, metadata={"help": "Peak learning rate (TRL)."})
    reward_model_path: str | None = field(
        default=None,
        metadata={"help": "Folder of a trained reward model (e.g. a reward run's final/)."},
    )
    reward_function: str | None = field(
        default=None,
        metadata={
            "help": "A Python reward function as 'module:function', called as "
            "f(prompts, completions, **columns) -> list[float]."
        },
    )
    reward_model_scoring: str = field(
        default="prefloop",
        metadata={
            "help": "'prefloop' scores completions with the reward model exactly as the reward "
            "recipe tokenized its training pairs (eos, special tokens, left truncation); 'trl' "
            "uses TRL's own scoring with the model's tokenizer (reward_processing_classes)."
        },
    )
    num_generations: int = field(
        default=8, metadata={"help": "Completions sampled per prompt (the group size)."}
    )
    per_device_train_batch_size: int = field(
        default=8,
        metadata={"help": "Completions per device per step; a multiple of num_generations."},
    )
    per_device_eval_batch_size: int = field(
        default=8,
        metadata={"help": "Completions per device per eval step; a multiple of num_generations."},
    )
    max_completion_length: int = field(
        default=128, metadata={"help": "Maximum tokens generated per completion."}
    )
    max_length: int | None = field(
        default=512,
        metadata={
            "help": "Maximum tokens of prompt + completion; prompts longer than max_length - "
            "max_completion_length are dropped and counted."
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold."})
    epsilon: float = field(
        default=0.2, metadata={"help": "Clipping range of the policy ratio (PPO-style)."}
    )
    num_iterations: int = field(
        default=1, metadata={"help": "Optimisation passes per generated batch (mu)."}
    )

    def validate(self) -> None:
        super().validate()
        if bool(self.reward_model_path) == bool(self.reward_function):
            raise ConfigError("give exactly one of reward_model_path and reward_function")
        if self.reward_model_path:
            check_local_dir("reward_model_path", self.reward_model_path)
        if self.reward_function:
            load_reward_function(self.reward_function)
        if self.reward_model_scoring not in SCORING_CHOICES:
            raise ConfigError(f"reward_model_scoring must be one of {SCORING_CHOICES}")
        if self.num_generations < 2:
            raise ConfigError("num_generations must be at least 2 (advantages are within-group)")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
            if getattr(self, name) % self.num_generations:
                raise ConfigError(f"{name} must be a multiple of num_generations")
        if self.max_completion_length < 1:
            raise ConfigError("max_completion_length must be >= 1")


@dataclass
class GRPORecipeConfig(OnlineConfig):
    """GRPO settings (Shao et al. 2024, DeepSeekMath)."""

    beta: float = field(
        default=0.0,
        metadata={
            "help": "KL coefficient to the reference policy; 0 (TRL default, after DAPO/Dr GRPO) "
            "skips the reference model. DeepSeekMath used 0.04."
        },
    )
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "Divide advantages by the reward std of the 'group', the 'batch', or 'none' "
            "(Dr GRPO, Liu et al. 2025)."
        },
    )
    loss_type: str | None = field(
        default=None, metadata={"help": "TRL GRPO loss aggregation; None keeps TRL's default."}
    )


@dataclass
class RLOORecipeConfig(OnlineConfig):
    """RLOO settings (Ahmadian et al. 2024)."""

    num_generations: int = field(
        default=4, metadata={"help": "Completions per prompt, k (RLOO paper used k = 2 and 4)."}
    )
    beta: float = field(
        default=0.05, metadata={"help": "KL coefficient to the reference policy (TRL default)."}
    )
    normalize_advantages: bool = field(
        default=False, metadata={"help": "Normalise advantages to mean 0, std 1 per batch."}
    )


def load_reward_function(spec: str) -> Callable:
    """Import ``module:function`` and return the callable."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"reward_function must look like 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward_function: cannot import {module_name!r} ({exc})") from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise ConfigError(f"reward_function: {module_name} has no callable {attr!r}")
    return func


def build_reward(config: OnlineConfig, logger: RunLogger) -> tuple[Any, Any]:
    """Return ``(reward_funcs, reward_processing_classes)`` for the TRL trainer."""
    if config.reward_function:
        logger.info(f"reward: function {config.reward_function}")
        return load_reward_function(config.reward_function), None
    path = check_local_dir("reward_model_path", config.reward_model_path)
    if config.reward_model_scoring == "trl":
        from transformers import AutoModelForSequenceClassification

        from training.trainers.reward import load_tokenizer

        tokenizer = load_tokenizer(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        logger.info(f"reward: model {path} (TRL scoring)")
        return model, tokenizer
    from training.trainers.reward import RewardScorer

    logger.info(f"reward: model {path} (scored as in reward training)")
    return RewardScorer(path), None


def prompt_filter(tokenizer, max_prompt_tokens: int | None):
    """Return a predicate keeping rows whose prompt fits in ``max_prompt_tokens``."""

    def fits(row: dict) -> bool:
        if max_prompt_tokens is None:
            return True
        prompt = row["prompt"]
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(
                prompt, tokenize=True, return_dict=True, add_generation_prompt=True
            )["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        return len(ids) <= max_prompt_tokens

    return fits


def _train(
    recipe: str,
    config: OnlineConfig,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger | None,
    trl_names: tuple[str, str],
    specific: dict[str, Any],
) -> dict[str, Any]:
    dataset_dir, output_dir, logger = start_run(recipe, config, dataset_dir, output_dir, logger)
    import trl

    from training.trainers.model_paths import resolve_model_path

    config_cls, trainer_cls = (getattr(trl, name) for name in trl_names)
    model_path = resolve_model_path(config.model_name_or_path)
    tokenizer = load_policy_tokenizer(config.tokenizer_name_or_path or model_path)
    splits = load_prompts(dataset_dir)
    max_prompt = None
    if config.max_length is not None:
        max_prompt = config.max_length - config.max_completion_length
        if max_prompt < 1:
            raise ConfigError("max_length must exceed max_completion_length")
    datasets, counts = {}, {}
    for name, dataset in splits.items():
        kept = dataset.filter(prompt_filter(tokenizer, max_prompt))
        datasets[name] = kept
        counts[f"{name}_prompts_in"] = len(dataset)
        counts[f"{name}_dropped_overlong"] = len(dataset) - len(kept)
    logger.event("preprocess", **counts)
    if not len(datasets["train"]):
        raise ConfigError("no training prompt fits in max_length - max_completion_length")

    reward_funcs, reward_tokenizers = build_reward(config, logger)
    args = make_trl_config(
        config_cls,
        config,
        **{
            **trainer_kwargs(config, output_dir, has_eval=datasets.get("validation") is not None),
            "num_generations": config.num_generations,
            "max_completion_length": config.max_completion_length,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "epsilon": config.epsilon,
            "num_iterations": config.num_iterations,
            **specific,
            **config.trl_args,
        },
    )
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=datasets["train"],
        eval_dataset=datasets.get("validation"),
        processing_class=tokenizer,
        reward_processing_classes=reward_tokenizers,
        peft_config=lora_config(config, "CAUSAL_LM"),
    )
    attach_logger(trainer, logger)
    checkpoint = resume_checkpoint(output_dir, config.resume, logger)
    metrics: dict[str, Any] = dict(trainer.train(resume_from_checkpoint=checkpoint).metrics)
    metrics.update(final_evaluation(trainer, config, datasets))
    metrics.update(counts)
    finish_run(recipe, trainer, config, dataset_dir, output_dir, logger, tokenizer, metrics)
    return metrics


def train_grpo(
    config: GRPORecipeConfig,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger | None = None,
) -> dict[str, Any]:
    """Run GRPO on the prompts of a snapshot; return the final metrics."""
    # Group-relative advantage A_i = (r_i - mean(r)) / std(r) (Shao et al. 2024, Eq. 3).
    specific = {"beta": config.beta, "scale_rewards": config.scale_rewards}
    if config.loss_type is not None:
        specific["loss_type"] = config.loss_type
    return _train(
        "grpo",
        config,
        dataset_dir,
        output_dir,
        logger,
        ("GRPOConfig", "GRPOTrainer"),
        specific,
    )


def train_rloo(
    config: RLOORecipeConfig,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger | None = None,
) -> dict[str, Any]:
    """Run RLOO on the prompts of a snapshot; return the final metrics."""
    # Leave-one-out baseline A_i = r_i - mean_{j != i} r_j (Ahmadian et al. 2024, Eq. 4).
    specific = {"beta": config.beta, "normalize_advantages": config.normalize_advantages}
    return _train(
        "rloo",
        config,
        dataset_dir,
        output_dir,
        logger,
        ("RLOOConfig", "RLOOTrainer"),
        specific,
    )
