"""DPO recipe: direct preference optimisation of a causal LM (TRL DPOTrainer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.trainers.common import (
    BaseRecipeConfig,
    ConfigError,
    attach_logger,
    final_evaluation,
    finish_run,
    lora_config,
    make_trl_config,
    resume_checkpoint,
    start_run,
    trainer_kwargs,
)
from training.trainers.data import load_preferences
from training.trainers.run_log import RunLogger

RECIPE = "dpo"
MAX_LABEL_SMOOTHING = 0.4  # rDPO divides by 1 - 2*eps: keep well away from 1/2


@dataclass
class Config(BaseRecipeConfig):
    """DPO settings; defaults follow Rafailov et al. 2023 and TRL."""

    learning_rate: float = field(
        default=1e-6, metadata={"help": "Peak learning rate (TRL default; DPO paper used 1e-6)."}
    )
    beta: float = field(
        default=0.1,
        metadata={
            "help": "beta: strength of the KL anchor to the reference policy (Rafailov et al. "
            "2023, Eq. 7); larger stays closer to the reference."
        },
    )
    loss_type: str = field(
        default="auto",
        metadata={
            "help": "TRL loss type ('sigmoid', 'ipo', 'robust', ...). 'auto' is 'sigmoid', or "
            "'robust' when label smoothing is in use."
        },
    )
    label_smoothing: float | None = field(
        default=None,
        metadata={
            "help": "Probability that a preference label is flipped (rDPO, Chowdhury et al. "
            "2024). None derives it from the data's soft labels as mean(1 - soft_label), "
            f"capped at {MAX_LABEL_SMOOTHING}; 0 turns it off."
        },
    )
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata={
            "help": "Compute the reference log-probs once before training (saves memory, "
            "costs a pass over the data at start)."
        },
    )
    group_by_length: bool = field(
        default=True,
        metadata={
            "help": "Batch pairs of similar length together: every row of a batch is padded to "
            "its longest, and on a CPU the padding is compute (as the SFT and reward recipes)."
        },
    )
    max_length: int | None = field(
        default=512,
        metadata={
            "help": "Maximum tokens of prompt + completion; longer pairs are truncated at the end "
            "(pairs whose prompt alone fills it are dropped and counted)."
        },
    )

    def validate(self) -> None:
        super().validate()
        if self.beta <= 0:
            raise ConfigError("beta must be positive")
        if self.label_smoothing is not None and not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError("label_smoothing must lie in [0, 0.5)")


def label_smoothing_from_soft_labels(dataset) -> float:
    """Return the mean flip probability 1 - P(chosen preferred) of a preference split."""
    # Flip-noise view of soft labels: eps = P(label wrong) (Chowdhury et al. 2024, §3).
    labels = dataset["soft_label"] if "soft_label" in dataset.column_names else []
    if not labels:
        return 0.0
    return min(MAX_LABEL_SMOOTHING, sum(1.0 - p for p in labels) / len(labels))


def resolve_loss(config: Config, train_dataset) -> tuple[str, float]:
    """Return the (loss_type, label_smoothing) this run will use."""
    smoothing = config.label_smoothing
    if smoothing is None:
        smoothing = label_smoothing_from_soft_labels(train_dataset)
    loss_type = config.loss_type
    if loss_type == "auto":
        loss_type = "robust" if smoothing > 0 else "sigmoid"
    return loss_type, smoothing


def load_policy_tokenizer(name_or_path: str):
    """Load a causal-LM tokenizer with a pad token (its eos when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def train(
    config: Config,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger | None = None,
) -> dict[str, Any]:
    """Run DPO on a preference snapshot; return the final metrics."""
    dataset_dir, output_dir, logger = start_run(RECIPE, config, dataset_dir, output_dir, logger)
    from trl import DPOConfig, DPOTrainer

    from training.trainers.model_paths import resolve_model_path

    model_path = resolve_model_path(config.model_name_or_path)
    tokenizer = load_policy_tokenizer(config.tokenizer_name_or_path or model_path)
    splits = load_preferences(dataset_dir)
    loss_type, smoothing = resolve_loss(config, splits.train)
    logger.event("loss", loss_type=loss_type, label_smoothing=smoothing, beta=config.beta)
    logger.info(f"DPO loss {loss_type}, beta={config.beta}, label_smoothing={smoothing:.3f}")

    datasets = {
        name: dataset.remove_columns(
            [c for c in ("margin", "soft_label", "group_id") if c in dataset.column_names]
        )
        for name, dataset in splits.items()
    }
    args = make_trl_config(
        DPOConfig,
        config,
        **trainer_kwargs(config, output_dir, has_eval=datasets.get("validation") is not None),
        beta=config.beta,
        loss_type=[loss_type],
        label_smoothing=smoothing,
        max_length=config.max_length,
        precompute_ref_log_probs=config.precompute_ref_log_probs,
        disable_dropout=True,
    )
    trainer_class = _length_grouped(DPOTrainer) if config.group_by_length else DPOTrainer
    trainer = trainer_class(
        model=model_path,
        args=args,
        train_dataset=datasets["train"],
        eval_dataset=datasets.get("validation"),
        processing_class=tokenizer,
        peft_config=lora_config(config, "CAUSAL_LM"),
    )
    attach_logger(trainer, logger)
    counts = {
        "train_pairs_in": len(datasets["train"]),
        "train_pairs_kept": len(trainer.train_dataset),
    }
    counts["train_dropped_overlong"] = counts["train_pairs_in"] - counts["train_pairs_kept"]
    logger.event("preprocess", **counts)
    if not counts["train_pairs_kept"]:
        raise ConfigError("every training prompt is longer than max_length")

    checkpoint = resume_checkpoint(output_dir, config.resume, logger)
    metrics: dict[str, Any] = dict(trainer.train(resume_from_checkpoint=checkpoint).metrics)
    metrics.update(final_evaluation(trainer, config, datasets))
    metrics.update(counts)
    metrics.update({"loss_type": loss_type, "label_smoothing": smoothing, "beta": config.beta})
    finish_run(RECIPE, trainer, config, dataset_dir, output_dir, logger, tokenizer, metrics)
    return metrics


def _length_grouped(trainer_class):
    """Return a DPOTrainer subclass that samples batches of pairs of similar length.

    transformers' `group_by_length` reads an `input_ids` or `length` column, and TRL's tokenized
    pairs have neither (`prompt_ids`, `chosen_ids`, `rejected_ids`; other columns are dropped
    before sampling), so the lengths are given to the same `LengthGroupedSampler` here.
    """
    from transformers.trainer_pt_utils import LengthGroupedSampler

    class LengthGroupedTrainer(trainer_class):
        def _get_train_sampler(self, train_dataset=None):
            dataset = self.train_dataset if train_dataset is None else train_dataset
            lengths = [
                len(prompt) + max(len(chosen), len(rejected))
                for prompt, chosen, rejected in zip(
                    dataset["prompt_ids"],
                    dataset["chosen_ids"],
                    dataset["rejected_ids"],
                    strict=True,
                )
            ]
            return LengthGroupedSampler(
                self.args.train_batch_size * self.args.gradient_accumulation_steps,
                dataset=dataset,
                lengths=lengths,
            )

    return LengthGroupedTrainer


def completion_logps(model, tokenizer, prompt: Any, completion: Any) -> float:
    """Return log p(completion | prompt) summed over tokens, tokenized as TRL's DPO does."""
    import torch
    from trl.data_utils import common_prefix_length

    if isinstance(completion, list):
        prompt_ids = tokenizer.apply_chat_template(
            prompt, tokenize=True, return_dict=True, add_generation_prompt=True
        )["input_ids"]
        full_ids = tokenizer.apply_chat_template(
            prompt + completion, tokenize=True, return_dict=True
        )["input_ids"]
    else:
        text = (
            completion
            if completion.endswith(tokenizer.eos_token)
            else completion + tokenizer.eos_token
        )
        prompt_ids = tokenizer(prompt)["input_ids"]
        full_ids = tokenizer(prompt + text)["input_ids"]
    start = common_prefix_length(list(prompt_ids), list(full_ids))
    ids = torch.tensor([list(full_ids)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return float(logps[start - 1 :].sum())


def implicit_rewards(
    policy_dir: str | Path, reference_dir: str | Path, rows, beta: float
) -> list[tuple[float, float]]:
    """Return DPO's implicit (chosen, rejected) rewards of each explicit-prompt pair."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_policy_tokenizer(str(policy_dir))
    policy = AutoModelForCausalLM.from_pretrained(str(policy_dir)).eval()
    reference = AutoModelForCausalLM.from_pretrained(str(reference_dir)).eval()
    rewards = []
    for row in rows:
        pair = []
        for answer in (row["chosen"], row["rejected"]):
            policy_logp = completion_logps(policy, tokenizer, row["prompt"], answer)
            reference_logp = completion_logps(reference, tokenizer, row["prompt"], answer)
            # r(x, y) = beta * log(pi(y|x) / pi_ref(y|x)) (Rafailov et al. 2023, Eq. 5)
            pair.append(beta * (policy_logp - reference_logp))
        rewards.append((pair[0], pair[1]))
    return rewards
