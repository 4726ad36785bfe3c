"""Shared pieces of every recipe: the base config, run logging, run.json, checkpoints, LoRA."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.trainers.checkpoints import newest_complete_checkpoint
from training.trainers.provenance import write_run_json
from training.trainers.run_log import RunLogger, metric_renamed

QUIET_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "DISABLE_MLFLOW_INTEGRATION": "TRUE",
}


class ConfigError(ValueError):
    """A recipe config that cannot be run as written."""


def set_quiet_offline_env() -> None:
    """Keep runs offline and their logs quiet unless the environment says otherwise."""
    for key, value in QUIET_OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1":
        import datasets
        import transformers

        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()
    # Deprecation notices from inside the libraries say nothing about this run.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|trl)\.")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    verbosity = os.environ.get("TRANSFORMERS_VERBOSITY")
    if verbosity:
        import transformers

        transformers.utils.logging.set_verbosity(
            transformers.utils.logging.log_levels.get(verbosity, 30)
        )


def attach_logger(trainer, logger: RunLogger) -> None:
    """Route the trainer's log lines through ``logger`` instead of printing dicts on stdout."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    if logger not in trainer.callback_handler.callbacks:
        trainer.add_callback(logger)


@dataclass
class BaseRecipeConfig:
    """Fields shared by every recipe; each recipe subclasses it and adds its own."""

    model_name_or_path: str = field(
        default="",
        metadata={
            "help": "Local folder of the model to start from (no hub access), or the alias "
            "'minilm' for the bundled all-MiniLM-L6-v2 encoder."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Local folder of the tokenizer; defaults to model_name_or_path."},
    )
    seed: int = field(
        default=42,
        metadata={"help": "Seed for model initialisation, data order and sampling."},
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate of AdamW."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "Learning-rate schedule (transformers scheduler name)."}
    )
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "Fraction of the training steps spent warming up."}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    num_train_epochs: float = field(
        default=1.0, metadata={"help": "Epochs over the training split (ignored if max_steps > 0)."}
    )
    max_steps: int = field(
        default=-1, metadata={"help": "Optimizer steps to run; -1 runs num_train_epochs epochs."}
    )
    per_device_train_batch_size: int = field(
        default=8,
        metadata={"help": "Training batch size per device (pairs for preference recipes)."},
    )
    per_device_eval_batch_size: int = field(
        default=8, metadata={"help": "Evaluation batch size per device."}
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches accumulated per optimizer step."}
    )
    max_length: int | None = field(
        default=512, metadata={"help": "Maximum tokens of prompt + completion."}
    )
    logging_steps: int = field(
        default=10, metadata={"help": "Log training metrics every N optimizer steps."}
    )
    eval_steps: int | None = field(
        default=None,
        metadata={
            "help": "Evaluate on the validation split every N steps; None evaluates only at "
            "the end."
        },
    )
    save_steps: int = field(
        default=200, metadata={"help": "Write a resumable checkpoint-N folder every N steps."}
    )
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Keep at most this many checkpoint-N folders."}
    )
    evaluate_at_end: bool = field(
        default=True,
        metadata={"help": "Evaluate on the validation and test splits after training."},
    )
    activation_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Recompute activations in the backward pass (saves memory, ~20% slower)."
        },
    )
    dataloader_num_workers: int = field(
        default=0,
        metadata={"help": "DataLoader worker processes; keep 0 inside Celery prefork workers."},
    )
    use_lora: bool = field(
        default=False, metadata={"help": "Train LoRA adapters (PEFT) instead of all weights."}
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(
        default=32, metadata={"help": "LoRA scaling alpha (update scaled by alpha / r)."}
    )
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] | str = field(
        default="all-linear",
        metadata={"help": "Modules that get adapters: a list of names or 'all-linear'."},
    )
    merge_lora: bool = field(
        default=True,
        metadata={
            "help": "Save final/ as a merged full model (adapters also kept in adapter/); "
            "False saves only the adapter in final/."
        },
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "Resume from the newest checkpoint-N in the output folder (set by --resume); "
            "starts from scratch when there is none."
        },
    )
    trl_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Extra keyword arguments passed unchanged to the TRL config (advanced; "
            "recorded in run.json like every other field)."
        },
    )

    def validate(self) -> None:
        """Raise ConfigError when the fields cannot work together."""
        if not self.model_name_or_path:
            raise ConfigError("model_name_or_path is required")
        check_local_dir("model_name_or_path", self.model_name_or_path)
        if self.tokenizer_name_or_path:
            check_local_dir("tokenizer_name_or_path", self.tokenizer_name_or_path)
        if self.max_steps == 0 or self.max_steps < -1:
            raise ConfigError("max_steps must be positive, or -1 to train for num_train_epochs")
        if self.per_device_train_batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ConfigError("batch size and gradient_accumulation_steps must be >= 1")
        if self.save_steps < 1 or self.logging_steps < 1:
            raise ConfigError("save_steps and logging_steps must be >= 1")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError("warmup_ratio must lie in [0, 1)")
        if self.use_lora and self.lora_r < 1:
            raise ConfigError("lora_r must be >= 1 when use_lora is true")

    def seeds(self) -> dict[str, int]:
        """Return every seed that shapes this run."""
        return {"seed": self.seed, "data_seed": self.seed}


def check_local_dir(name: str, value: str) -> str:
    """Resolve a model alias and make sure the folder exists (nothing comes from the hub)."""
    from training.trainers.model_paths import resolve_model_path

    try:
        path = resolve_model_path(value)
    except FileNotFoundError as exc:
        raise ConfigError(f"{name}: {exc}") from exc
    if not Path(path).is_dir():
        raise ConfigError(f"{name}: no such local folder: {path}")
    return path


def config_from_dict(config_cls: type, values: dict[str, Any]):
    """Build ``config_cls`` from a mapping, rejecting unknown fields with a clear error."""
    if not isinstance(values, dict):
        raise ConfigError(f"config must be a mapping of field names to values, got {type(values)}")
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown config field(s) for {config_cls.__name__}: {', '.join(unknown)}; "
            f"known fields: {', '.join(sorted(known))}"
        )
    wrong = [
        f"{name}={values[name]!r} (expected {hint})"
        for name, hint in _field_types(config_cls).items()
        if name in values and not _matches(values[name], hint)
    ]
    if wrong:
        raise ConfigError(f"wrong type for {config_cls.__name__} field(s): {'; '.join(wrong)}")
    try:
        config = config_cls(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
    if hasattr(config, "validate"):
        config.validate()
    return config


def cuda_available() -> bool:
    """Return whether a CUDA device is visible."""
    import torch

    return bool(torch.cuda.is_available())


def _field_types(config_cls: type) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(config_cls)
    except Exception:  # an annotation that cannot be resolved: skip the check
        return {}


def _matches(value: Any, hint: Any) -> bool:
    """Return whether a JSON/YAML value fits a field annotation (loosely: int fits float)."""
    import types
    import typing

    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is not None:
        hint = origin
    if not isinstance(hint, type):
        return True
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (list, tuple):
        return isinstance(value, list | tuple)
    return isinstance(value, hint)


def use_bf16() -> bool:
    """Return whether bf16 mixed precision is available (a CUDA device that supports it)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def trainer_kwargs(config: BaseRecipeConfig, output_dir: Path, *, has_eval: bool) -> dict:
    """Translate the shared config fields into transformers/TRL training arguments."""
    eval_strategy = "steps" if (has_eval and config.eval_steps) else "no"
    kwargs = {
        "output_dir": str(output_dir),
        "seed": config.seed,
        "data_seed": config.seed,
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": config.lr_scheduler_type,
        "warmup_steps": config.warmup_ratio,  # transformers 5: a float < 1 is a ratio
        "weight_decay": config.weight_decay,
        "max_grad_norm": config.max_grad_norm,
        "num_train_epochs": config.num_train_epochs,
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "per_device_eval_batch_size": config.per_device_eval_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "logging_steps": config.logging_steps,
        "logging_first_step": True,
        "eval_strategy": eval_strategy,
        "eval_steps": config.eval_steps if eval_strategy == "steps" else None,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": config.save_total_limit,
        "bf16": use_bf16(),
        "fp16": False,
        "activation_checkpointing": config.activation_checkpointing,
        "dataloader_num_workers": config.dataloader_num_workers,
        "dataloader_pin_memory": cuda_available(),
        "report_to": "none",
        "disable_tqdm": not sys.stderr.isatty(),
    }
    kwargs.update(config.trl_args)
    return kwargs


def make_trl_config(config_cls: type, config: BaseRecipeConfig, **kwargs):
    """Instantiate a TRL config, turning its argument errors into ConfigError."""
    try:
        return config_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config_cls.__name__}: {exc}") from exc


def lora_config(config: BaseRecipeConfig, task_type: str):
    """Return a PEFT LoraConfig for ``task_type`` (CAUSAL_LM or SEQ_CLS), or None without LoRA."""
    if not config.use_lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
        task_type=task_type,
    )


def resume_checkpoint(output_dir: Path, resume: bool, logger: RunLogger) -> str | None:
    """Pick the checkpoint to resume from, and log the choice."""
    if not resume:
        return None
    found = newest_complete_checkpoint(output_dir)
    checkpoint = found[0] if found else None
    logger.event("resume", checkpoint=checkpoint)
    if checkpoint is None:
        logger.info("resume requested but no checkpoint-* found: starting from scratch")
    else:
        logger.info(f"resuming from {checkpoint}")
    return checkpoint


def evaluate_split(trainer, dataset, prefix: str) -> dict[str, Any]:
    """Evaluate ``dataset`` and return its metrics, all named ``<prefix>_*``.

    TRL's trainers name their own metrics ``eval_*`` whatever the prefix; rename them.
    """
    metrics = trainer.evaluate(dataset, metric_key_prefix=prefix)
    return {metric_renamed(key, prefix): value for key, value in metrics.items()}


def save_final(trainer, output_dir: Path, config: BaseRecipeConfig, tokenizer) -> Path:
    """Save the final model and tokenizer to ``output_dir/final`` (LoRA merged by default)."""
    from accelerate.utils import is_peft_model

    final_dir = output_dir / "final"
    model = trainer.accelerator.unwrap_model(trainer.model)
    main = trainer.accelerator.is_main_process
    if not is_peft_model(model):
        trainer.save_model(str(final_dir))  # gathers sharded (FSDP / ZeRO-3) weights
        if main:
            tokenizer.save_pretrained(str(final_dir))
        return final_dir
    adapter_dir = output_dir / "adapter"
    trainer.save_model(str(adapter_dir))
    trainer.accelerator.wait_for_everyone()
    if main:
        tokenizer.save_pretrained(str(adapter_dir))
        merged = model.merge_and_unload() if config.merge_lora else model
        merged.save_pretrained(str(final_dir))
        tokenizer.save_pretrained(str(final_dir))
    return final_dir


def start_run(
    recipe: str,
    config: BaseRecipeConfig,
    dataset_dir: str | Path,
    output_dir: str | Path,
    logger: RunLogger | None,
) -> tuple[Path, Path, RunLogger]:
    """Validate, quiet the libraries, seed, and write the first run.json."""
    set_quiet_offline_env()
    from transformers import set_seed

    config.validate()
    dataset_dir, output_dir = Path(dataset_dir), Path(output_dir)
    logger = logger or RunLogger(output_dir)
    if os.environ.get("RANK", "0") == "0":
        write_run_json(
            output_dir, config, dataset_dir, config.seeds(), recipe=recipe, status="running"
        )
    logger.event("start", recipe=recipe, resume=config.resume)
    set_seed(config.seed)
    return dataset_dir, output_dir, logger


def final_evaluation(trainer, config: BaseRecipeConfig, splits: dict[str, Any]) -> dict[str, Any]:
    """Evaluate on the validation (``eval_*``) and test (``test_*``) splits that exist."""
    metrics: dict[str, Any] = {}
    if not config.evaluate_at_end:
        return metrics
    for name, prefix in (("validation", "eval"), ("test", "test")):
        dataset = splits.get(name)
        if dataset is not None and len(dataset):
            metrics.update(evaluate_split(trainer, dataset, prefix))
    return metrics


def finish_run(
    recipe: str,
    trainer,
    config: BaseRecipeConfig,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger,
    tokenizer,
    metrics: dict[str, Any],
) -> Path:
    """Save final/, log the final metrics, and complete run.json; return the final folder."""
    final_dir = save_final(trainer, output_dir, config, tokenizer)
    metrics.setdefault("global_step", trainer.state.global_step)
    logger.event("final", **metrics)
    logger.finish(**{k: v for k, v in metrics.items() if isinstance(v, int | float)})
    if trainer.accelerator.is_main_process:
        write_run_json(
            output_dir,
            config,
            dataset_dir,
            config.seeds(),
            recipe=recipe,
            status="finished",
            final_dir=str(final_dir),
            final_metrics=metrics,
            trl_config=_trl_config_dict(trainer.args),
        )
    return final_dir


def _trl_config_dict(args) -> dict[str, Any]:
    try:
        return json.loads(args.to_json_string())
    except (TypeError, ValueError):  # pragma: no cover - an exotic field that is not JSON
        return {"repr": repr(args)}
