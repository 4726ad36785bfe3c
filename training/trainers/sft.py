"""SFT recipe: supervised fine-tuning of a causal LM on demonstrations (TRL SFTTrainer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.trainers.common import (
    BaseRecipeConfig,
    attach_logger,
    final_evaluation,
    finish_run,
    lora_config,
    make_trl_config,
    resume_checkpoint,
    start_run,
    trainer_kwargs,
)
from training.trainers.data import load_sft
from training.trainers.dpo import load_policy_tokenizer
from training.trainers.run_log import RunLogger

RECIPE = "sft"


@dataclass
class Config(BaseRecipeConfig):
    """SFT settings; defaults follow Alpaca (Taori et al. 2023): lr 2e-5, 3 epochs."""

    learning_rate: float = field(default=2e-5, metadata={"help": "Peak learning rate."})
    num_train_epochs: float = field(
        default=3.0, metadata={"help": "Epochs over the demonstrations."}
    )
    assistant_only_loss: bool | None = field(
        default=None,
        metadata={
            "help": "Train only on assistant turns of conversations (needs {% generation %} in "
            "the chat template). None: on for {messages} data, off otherwise."
        },
    )
    completion_only_loss: bool | None = field(
        default=None,
        metadata={
            "help": "Train only on the completion of {prompt, completion} rows. None: on for "
            "prompt/completion data (TRL default)."
        },
    )
    group_by_length: bool = field(
        default=True,
        metadata={"help": "Batch rows of similar length together (less padding, faster on CPU)."},
    )


def train(
    config: Config,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger | None = None,
) -> dict[str, Any]:
    """Fine-tune on an SFT snapshot (or the chosen answers of a preference snapshot)."""
    dataset_dir, output_dir, logger = start_run(RECIPE, config, dataset_dir, output_dir, logger)
    from trl import SFTConfig, SFTTrainer

    from training.trainers.model_paths import resolve_model_path

    model_path = resolve_model_path(config.model_name_or_path)
    tokenizer = load_policy_tokenizer(config.tokenizer_name_or_path or model_path)
    splits = load_sft(dataset_dir)
    datasets = dict(splits.items())
    columns = datasets["train"].column_names
    assistant_only = config.assistant_only_loss
    if assistant_only is None:
        assistant_only = "messages" in columns
    logger.event(
        "data",
        data_kind=splits.kind,
        rows={name: len(dataset) for name, dataset in datasets.items()},
        assistant_only_loss=assistant_only,
    )
    args = make_trl_config(
        SFTConfig,
        config,
        **trainer_kwargs(config, output_dir, has_eval=datasets.get("validation") is not None),
        max_length=config.max_length,
        assistant_only_loss=assistant_only,
        completion_only_loss=config.completion_only_loss,
        packing=False,
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
    )
    trainer = SFTTrainer(
        model=model_path,
        args=args,
        train_dataset=datasets["train"],
        eval_dataset=datasets.get("validation"),
        processing_class=tokenizer,
        peft_config=lora_config(config, "CAUSAL_LM"),
    )
    attach_logger(trainer, logger)
    checkpoint = resume_checkpoint(output_dir, config.resume, logger)
    metrics: dict[str, Any] = dict(trainer.train(resume_from_checkpoint=checkpoint).metrics)
    metrics.update(final_evaluation(trainer, config, datasets))
    metrics.update({f"{name}_rows": len(dataset) for name, dataset in datasets.items()})
    finish_run(RECIPE, trainer, config, dataset_dir, output_dir, logger, tokenizer, metrics)
    return metrics
