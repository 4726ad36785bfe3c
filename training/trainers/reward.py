"""Reward-model recipe: Bradley-Terry training of a one-output classifier (TRL RewardTrainer)."""

from __future__ import annotations

import json
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

RECIPE = "reward"
PREPROCESSING_FILE = "prefloop_reward.json"
OVERLONG_CHOICES = ("truncate_left", "drop")
TIES_CHOICES = ("soft", "drop")
TRAIN_ON_CHOICES = ("train", "held_out")
ENSEMBLE_FILE = "prefloop_ensemble.json"
MEMBERS_DIR = "members"
MAX_ENSEMBLE = 8


@dataclass
class Config(BaseRecipeConfig):
    """Reward-model training settings (Bradley-Terry on preference pairs)."""

    learning_rate: float = field(
        default=2e-5,
        metadata={"help": "Peak learning rate (fine-tuning range of BERT-size encoders)."},
    )
    num_train_epochs: float = field(
        default=1.0,
        metadata={"help": "Epochs; one epoch avoids RM overfitting (Ouyang et al. 2022, §C.2)."},
    )
    use_margin: bool = field(
        default=False,
        metadata={
            "help": "Margin from strength: subtract each pair's 'margin' (from annotation "
            "strength) inside the loss, as in Llama 2 (Touvron et al. 2023, Eq. 2): "
            "-log s(d - m)."
        },
    )
    margin_scale: float = field(
        default=1.0, metadata={"help": "Factor applied to the data's margins when use_margin."}
    )
    soft_labels: bool = field(
        default=True,
        metadata={
            "help": "Train on each pair's soft_label q = P(chosen preferred) with the binary "
            "cross-entropy -(q log s(d) + (1-q) log s(-d)), d = r_chosen - r_rejected; "
            "false treats every kept pair as a sure win (q = 1, plain Bradley-Terry)."
        },
    )
    ties: str = field(
        default="soft",
        metadata={
            "help": "Rows the export marks as ties: 'soft' trains them with q = 1/2 (their "
            "rewards are pulled together); 'drop' leaves them out.",
            "choices": TIES_CHOICES,
        },
    )
    tie_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of a tie row in the loss relative to a decided pair."},
    )
    per_prompt_weighting: bool = field(
        default=False,
        metadata={
            "help": "Weight each pair by 1 / (pairs of its prompt), normalised to mean 1, so "
            "a prompt ranked over many answers counts once (Ouyang et al. 2022, §C.2)."
        },
    )
    ensemble_size: int = field(
        default=1,
        metadata={
            "help": "Members of a seed ensemble (seeds seed, seed+1, ...; Coste et al. 2024): "
            "the scorer returns their mean reward and their std as the uncertainty, and the "
            "mean std on the validation split is saved in prefloop_ensemble.json."
        },
    )
    train_on: str = field(
        default="train",
        metadata={
            "help": "'train' learns from the train split and validates on validation. "
            "'held_out' learns from the validation and test splits and validates on train: a "
            "judge for a policy optimised against the train split's reward model, whose "
            "verdicts the optimisation has not bent (Gao et al. 2023).",
            "choices": TRAIN_ON_CHOICES,
        },
    )
    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={
            "help": "Weight of the mean-zero reward penalty (Eisenstein et al. 2023, Eq. 2); "
            "0.01 is the recommended value, None turns it off."
        },
    )
    overlong: str = field(
        default="truncate_left",
        metadata={
            "help": "Pairs longer than max_length: 'truncate_left' keeps the leading special "
            "tokens and the last tokens (where answers differ); 'drop' discards the pair."
        },
    )
    group_by_length: bool = field(
        default=True,
        metadata={"help": "Batch pairs of similar length together (less padding, faster)."},
    )
    eos_token: str | None = field(
        default=None,
        metadata={
            "help": "Token appended to plain-text sequences; defaults to the tokenizer's eos "
            "([SEP] for BERT-style tokenizers without one)."
        },
    )

    def validate(self) -> None:
        super().validate()
        if self.overlong not in OVERLONG_CHOICES:
            raise ConfigError(f"overlong must be one of {OVERLONG_CHOICES}, got {self.overlong!r}")
        if self.max_length is not None and self.max_length < 8:
            raise ConfigError("max_length must be at least 8 tokens")
        if self.ties not in TIES_CHOICES:
            raise ConfigError(f"ties must be one of {TIES_CHOICES}, got {self.ties!r}")
        if not self.tie_weight >= 0:
            raise ConfigError("tie_weight must be a number >= 0")
        if self.train_on not in TRAIN_ON_CHOICES:
            raise ConfigError(f"train_on must be one of {TRAIN_ON_CHOICES}, got {self.train_on!r}")
        if not 1 <= self.ensemble_size <= MAX_ENSEMBLE:
            raise ConfigError(f"ensemble_size must be between 1 and {MAX_ENSEMBLE}")


def load_tokenizer(name_or_path: str, eos_token: str | None = None):
    """Load a tokenizer and give it eos/pad/chat template as the reward recipe needs."""
    from transformers import AutoTokenizer

    from training.trainers.chat_templates import prepare_tokenizer
    from training.trainers.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    if eos_token is not None:
        if eos_token not in tokenizer.get_vocab():
            raise ConfigError(f"eos_token {eos_token!r} is not in the tokenizer's vocabulary")
        tokenizer.eos_token = eos_token
    return prepare_tokenizer(tokenizer)


def sequence_ids(tokenizer, prompt: Any, completion: Any) -> list[int]:
    """Tokenize prompt + completion exactly as TRL's RewardTrainer does before its filter.

    Conversations go through the chat template; plain text gets the eos appended.
    """
    if isinstance(completion, list):
        messages = (prompt or []) + completion
        return list(
            tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        )
    text = (prompt or "") + completion
    if not text.endswith(tokenizer.eos_token):
        text += tokenizer.eos_token
    return list(tokenizer(text)["input_ids"])


def leading_special_count(tokenizer) -> int:
    """Return how many special tokens the tokenizer puts before any text (1 for BERT's [CLS])."""
    ids = tokenizer("x")["input_ids"]
    special = set(tokenizer.all_special_ids)
    count = 0
    for token_id in ids:
        if token_id not in special:
            break
        count += 1
    return count


def truncate_left(ids: list[int], max_length: int, keep_first: int) -> list[int]:
    """Keep the first ``keep_first`` tokens and the last tokens, ``max_length`` in all."""
    if len(ids) <= max_length:
        return ids
    keep_first = min(keep_first, max_length - 1)
    return ids[:keep_first] + ids[len(ids) - (max_length - keep_first) :]


@dataclass
class Preprocessing:
    """How text becomes reward-model input; saved beside the model so scoring matches training."""

    max_length: int | None
    overlong: str
    eos_token: str
    keep_first: int

    def ids(self, tokenizer, prompt: Any, completion: Any) -> list[int] | None:
        """Return the input ids of one sequence, or None when it is too long and dropped."""
        ids = sequence_ids(tokenizer, prompt, completion)
        if self.max_length is None or len(ids) <= self.max_length:
            return ids
        if self.overlong == "drop":
            return None
        return truncate_left(ids, self.max_length, self.keep_first)

    def save(self, model_dir: Path) -> None:
        (model_dir / PREPROCESSING_FILE).write_text(json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def load(cls, model_dir: Path, tokenizer) -> Preprocessing:
        path = model_dir / PREPROCESSING_FILE
        if path.exists():
            return cls(**json.loads(path.read_text()))
        return cls(
            max_length=None,
            overlong="truncate_left",
            eos_token=tokenizer.eos_token,
            keep_first=leading_special_count(tokenizer),
        )


def preference_loss(
    chosen,
    rejected,
    *,
    soft_label=None,
    margin=None,
    weight=None,
):
    """Return the mean (weighted) soft-target Bradley-Terry loss of a batch of reward pairs.

    With d = r_chosen - r_rejected, q = P(chosen preferred) and margin m the loss of a pair is
    -(q log s(d - m) + (1 - q) log s(-d - m)): binary cross-entropy on the Bradley-Terry
    probability (Bradley & Terry 1952; soft targets as in Ouyang et al. 2022, §C.2 with
    ties at q = 1/2), and for q = 1 Llama 2's margin loss -log s(d - m) (Touvron et al. 2023,
    Eq. 2). The margin is asked of whichever side q favours, so a tie (m = 0) is unaffected.
    ``weight`` multiplies each pair's loss; weights are expected to average 1 over the data.
    """
    import torch.nn.functional as F

    difference = chosen - rejected
    shift = 0.0 if margin is None else margin
    per_pair = -F.logsigmoid(difference - shift)
    if soft_label is not None:
        per_pair = soft_label * per_pair - (1.0 - soft_label) * F.logsigmoid(-difference - shift)
    if weight is not None:
        per_pair = per_pair * weight
    return per_pair.mean()


def prompt_weights(prompts: list[Any]) -> list[float]:
    """Return 1 / (pairs of the row's prompt) per row, scaled so the weights average 1."""
    keys = [json.dumps(prompt, sort_keys=True) for prompt in prompts]
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    raw = [1.0 / counts[key] for key in keys]
    scale = len(raw) / sum(raw) if raw else 1.0
    return [value * scale for value in raw]


def tokenize_pairs(
    dataset,
    tokenizer,
    prep: Preprocessing,
    *,
    use_margin: bool,
    margin_scale: float,
    soft_labels: bool = True,
    ties: str = "soft",
    tie_weight: float = 1.0,
    per_prompt_weighting: bool = False,
):
    """Turn preference rows into TRL's pre-tokenized ``chosen_ids``/``rejected_ids`` columns.

    Each row also carries ``soft_label`` (q: the data's, 1 when ``soft_labels`` is off, 1/2
    for a tie) and ``weight`` (tie weight times the per-prompt weight). Returns
    ``(dataset, counts)``; counts has the pairs kept, truncated and dropped.
    """
    counts = {
        "pairs_in": len(dataset),
        "truncated": 0,
        "dropped_overlong": 0,
        "dropped_identical": 0,
        "dropped_ties": 0,
        "ties": 0,
    }
    rows = []
    prompts = []
    for row in dataset:
        prompt = row.get("prompt")
        tie = bool(row.get("tie"))
        if tie and ties == "drop":
            counts["dropped_ties"] += 1
            continue
        raw_chosen = sequence_ids(tokenizer, prompt, row["chosen"])
        raw_rejected = sequence_ids(tokenizer, prompt, row["rejected"])
        chosen = prep.ids(tokenizer, prompt, row["chosen"])
        rejected = prep.ids(tokenizer, prompt, row["rejected"])
        if chosen is None or rejected is None:
            counts["dropped_overlong"] += 1
            continue
        if chosen == rejected:  # truncation (or the data) left nothing to compare
            counts["dropped_identical"] += 1
            continue
        if len(chosen) < len(raw_chosen) or len(rejected) < len(raw_rejected):
            counts["truncated"] += 1
        item = {
            "chosen_ids": chosen,
            "rejected_ids": rejected,
            "length": max(len(chosen), len(rejected)),
        }
        if use_margin:
            item["margin"] = 0.0 if tie else float(row["margin"]) * margin_scale
        if tie:
            counts["ties"] += 1
            item["soft_label"] = 0.5
        else:
            item["soft_label"] = float(row.get("soft_label", 1.0)) if soft_labels else 1.0
        item["weight"] = tie_weight if tie else 1.0
        rows.append(item)
        prompts.append(prompt)
    if per_prompt_weighting:
        for item, share in zip(rows, prompt_weights(prompts), strict=True):
            item["weight"] *= share
    counts["pairs_kept"] = len(rows)
    from datasets import Dataset

    return Dataset.from_list(rows), counts


def collate_pairs(pad_token_id: int):
    """Return TRL's preference collator extended with the ``soft_label`` and ``weight`` columns."""
    import torch
    from trl.trainer.reward_trainer import DataCollatorForPreference

    base = DataCollatorForPreference(pad_token_id=pad_token_id)

    def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = base(examples)
        for key in ("soft_label", "weight"):
            batch[key] = torch.tensor([e[key] for e in examples], dtype=torch.float)
        return batch

    return collate


def soft_reward_trainer_class():
    """Return TRL's RewardTrainer with its loss replaced by ``preference_loss``."""
    import torch
    from trl import RewardTrainer

    class SoftRewardTrainer(RewardTrainer):
        """RewardTrainer whose loss reads soft labels, margins and pair weights."""

        def _set_signature_columns_if_needed(self):
            if self._signature_columns is None:
                self._signature_columns = [
                    "chosen_ids",
                    "rejected_ids",
                    "margin",
                    "soft_label",
                    "weight",
                ]

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mode = "train" if self.model.training else "eval"
            margin = inputs.pop("margin", None)
            soft_label = inputs.pop("soft_label")
            weight = inputs.pop("weight")
            inputs["use_cache"] = False
            outputs = model(**inputs)
            rewards_chosen, rewards_rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
            loss = preference_loss(
                rewards_chosen,
                rewards_rejected,
                soft_label=soft_label,
                margin=margin,
                weight=weight,
            )
            if self.args.center_rewards_coefficient is not None:
                # Eisenstein et al. 2023, Eq. 2: keep rewards near zero.
                loss += self.args.center_rewards_coefficient * torch.mean(
                    (rewards_chosen + rewards_rejected) ** 2
                )
            if mode == "train":
                tokens = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum())
                self._total_train_tokens += tokens.sum().item() // self._tp_size
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            with torch.no_grad():
                all_rewards = self.accelerator.gather(outputs.logits)
                self._metrics[mode]["min_reward"].append(all_rewards.min().item())
                self._metrics[mode]["mean_reward"].append(all_rewards.mean().item())
                self._metrics[mode]["max_reward"].append(all_rewards.max().item())
                # Accuracy over decided pairs only: a tie (q = 1/2) has no right order.
                decided = soft_label != 0.5
                wins = (rewards_chosen > rewards_rejected).float()
                accuracy = wins[decided].mean() if decided.any() else wins.sum() * float("nan")
                accuracy = self.accelerator.gather_for_metrics(accuracy).nanmean().item()
                if accuracy == accuracy:  # not NaN: some process had a decided pair
                    self._metrics[mode]["accuracy"].append(accuracy)
                mean_margin = (rewards_chosen - rewards_rejected).mean()
                mean_margin = self.accelerator.gather_for_metrics(mean_margin).mean()
                self._metrics[mode]["margin"].append(mean_margin.item())
            return (loss, outputs) if return_outputs else loss

    return SoftRewardTrainer


@dataclass(frozen=True)
class Calibration:
    """How raw rewards become calibrated ones: divide by a temperature, then shift and scale.

    The temperature is fitted on held-out pairs (Guo et al. 2017, temperature scaling), so
    s((r_a - r_b) / T) is a calibrated P(a preferred); ``shift``/``scale`` are the mean and
    std of the temperature-scaled rewards of the reference policy's answers, frozen so the
    reward reads as standard deviations from the reference (Ziegler et al. 2019, §2.2).
    """

    temperature: float = 1.0
    shift: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and self.scale > 0):
            raise ConfigError("temperature and scale of a calibration must be positive")

    def apply(self, scores: list[float]) -> list[float]:
        """Return the calibrated value of each raw reward."""
        return [(score / self.temperature - self.shift) / self.scale for score in scores]


class RewardScorer:
    """Score prompt/completion pairs with a saved reward model, preprocessing as in training.

    Callable as a TRL reward function: ``scorer(prompts=..., completions=...) -> list[float]``.
    With a ``calibration`` every score is divided by its temperature and normalised.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        batch_size: int = 16,
        device: str | None = None,
        calibration: Calibration | None = None,
    ):
        import torch
        from transformers import AutoModelForSequenceClassification

        from training.trainers.model_paths import resolve_model_path

        self.model_dir = Path(resolve_model_path(str(model_dir)))
        self.tokenizer = load_tokenizer(str(self.model_dir))
        self.prep = Preprocessing.load(self.model_dir, self.tokenizer)
        self.tokenizer.eos_token = self.prep.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(self.model_dir), num_labels=1, dtype=torch.float32
        )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()
        self.members = [self.model]
        members_dir = self.model_dir / MEMBERS_DIR
        if members_dir.is_dir():
            for member_dir in sorted(members_dir.iterdir(), key=lambda p: int(p.name)):
                member = AutoModelForSequenceClassification.from_pretrained(
                    str(member_dir), num_labels=1, dtype=torch.float32
                )
                member.config.pad_token_id = self.tokenizer.pad_token_id
                self.members.append(member.eval())
        self.batch_size = batch_size
        self.device = device
        self.calibration = calibration
        self.__name__ = f"reward_model:{self.model_dir.name}"

    def _device(self):
        if self.device is None:
            from accelerate import PartialState

            self.device = str(PartialState().device)
        return self.device

    def _member_scores(self, model, batch_ids: list[list[int]]) -> list[float]:
        """Return one model's raw reward of each pre-tokenized sequence."""
        import torch
        from trl.trainer.utils import pad

        device = self._device()
        model.to(device)
        scores: list[float] = []
        for start in range(0, len(batch_ids), self.batch_size):
            chunk = [torch.tensor(ids) for ids in batch_ids[start : start + self.batch_size]]
            input_ids = pad(chunk, padding_value=self.tokenizer.pad_token_id, padding_side="right")
            mask = pad([torch.ones_like(t) for t in chunk], padding_value=0, padding_side="right")
            with torch.inference_mode():
                logits = model(
                    input_ids=input_ids.to(device), attention_mask=mask.to(device)
                ).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores

    def member_scores_ids(self, batch_ids: list[list[int]]) -> list[list[float]]:
        """Return each ensemble member's (calibrated) reward of each pre-tokenized sequence."""
        per_member = []
        for model in self.members:
            raw = self._member_scores(model, batch_ids)
            per_member.append(raw if self.calibration is None else self.calibration.apply(raw))
        return per_member

    def score_ids_with_spread(self, batch_ids: list[list[int]]) -> tuple[list[float], list[float]]:
        """Return the (calibrated) mean reward over ensemble members and their std per sequence.

        A single model has spread 0. The std is in the same units as the returned reward.
        """
        import numpy as np

        values = np.asarray(self.member_scores_ids(batch_ids), dtype=float)
        return values.mean(axis=0).tolist(), values.std(axis=0).tolist()

    def score_ids(self, batch_ids: list[list[int]]) -> list[float]:
        """Return the reward of each pre-tokenized sequence (the ensemble mean, calibrated)."""
        if len(self.members) == 1:
            raw = self._member_scores(self.model, batch_ids)
            return raw if self.calibration is None else self.calibration.apply(raw)
        return self.score_ids_with_spread(batch_ids)[0]

    def score(self, prompts: list[Any], completions: list[Any]) -> list[float]:
        """Return the reward of each (prompt, completion)."""
        return self.score_ids(self._ids(prompts, completions))

    def score_with_spread(
        self, prompts: list[Any], completions: list[Any]
    ) -> tuple[list[float], list[float]]:
        """Return the reward of each (prompt, completion) and the ensemble's std of it."""
        return self.score_ids_with_spread(self._ids(prompts, completions))

    def member_scores(self, prompts: list[Any], completions: list[Any]) -> list[list[float]]:
        """Return each member's reward of each (prompt, completion): ``[members][pairs]``."""
        return self.member_scores_ids(self._ids(prompts, completions))

    def _ids(self, prompts: list[Any], completions: list[Any]) -> list[list[int]]:
        """Return the input ids of each (prompt, completion), preprocessed as in training."""
        ids = []
        for prompt, completion in zip(prompts, completions, strict=True):
            seq = self.prep.ids(self.tokenizer, prompt, completion)
            if seq is None:  # a 'drop' model still has to score: keep the end instead
                seq = truncate_left(
                    sequence_ids(self.tokenizer, prompt, completion),
                    self.prep.max_length,
                    self.prep.keep_first,
                )
            ids.append(seq)
        return ids

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return self.score(prompts, completions)


def pairwise_accuracy(scorer: RewardScorer, rows) -> dict[str, float]:
    """Return the share of pairs whose chosen answer scores strictly higher, and the mean margin."""
    prompts = [row.get("prompt") for row in rows]
    chosen = scorer.score(prompts, [row["chosen"] for row in rows])
    rejected = scorer.score(prompts, [row["rejected"] for row in rows])
    wins = [c > r for c, r in zip(chosen, rejected, strict=True)]
    return {
        "accuracy": sum(wins) / len(wins),
        "margin": sum(c - r for c, r in zip(chosen, rejected, strict=True)) / len(wins),
        "n": len(wins),
    }


def train(
    config: Config,
    dataset_dir: Path,
    output_dir: Path,
    logger: RunLogger | None = None,
) -> dict[str, Any]:
    """Train a reward model on a preference snapshot; return the final metrics."""
    dataset_dir, output_dir, logger = start_run(RECIPE, config, dataset_dir, output_dir, logger)
    from training.trainers.model_paths import resolve_model_path

    model_path = resolve_model_path(config.model_name_or_path)
    tokenizer = load_tokenizer(config.tokenizer_name_or_path or model_path, config.eos_token)
    prep = Preprocessing(
        max_length=config.max_length,
        overlong=config.overlong,
        eos_token=tokenizer.eos_token,
        keep_first=leading_special_count(tokenizer),
    )
    splits = load_preferences(dataset_dir)
    if config.train_on == "held_out":
        splits = held_out_splits(splits)
    prepared, counts = {}, {}
    for name, dataset in splits.items():
        prepared[name], counts[name] = tokenize_pairs(
            dataset,
            tokenizer,
            prep,
            use_margin=config.use_margin,
            margin_scale=config.margin_scale,
            soft_labels=config.soft_labels,
            ties=config.ties,
            tie_weight=config.tie_weight,
            per_prompt_weighting=config.per_prompt_weighting and name == "train",
        )
        logger.event("preprocess", split=name, **counts[name])
        logger.info(f"{name} pairs: {counts[name]}")
    if not len(prepared["train"]):
        raise ConfigError("no training pair is left after preprocessing (see overlong/max_length)")

    trainer = _trainer(config, model_path, tokenizer, prepared, output_dir)
    attach_logger(trainer, logger)
    checkpoint = resume_checkpoint(output_dir, config.resume, logger)
    metrics: dict[str, Any] = dict(trainer.train(resume_from_checkpoint=checkpoint).metrics)
    metrics.update(final_evaluation(trainer, config, prepared))
    for name, split_counts in counts.items():
        metrics.update({f"{name}_{key}": value for key, value in split_counts.items()})
    member_dirs = []
    for index in range(1, config.ensemble_size):
        member_dirs.append(
            _train_member(config, index, model_path, tokenizer, prepared, output_dir, logger)
        )
    if member_dirs:
        metrics["ensemble_size"] = config.ensemble_size
    final_dir = finish_run(
        RECIPE, trainer, config, dataset_dir, output_dir, logger, tokenizer, metrics
    )
    if trainer.accelerator.is_main_process:
        prep.save(final_dir)
        if member_dirs:
            _save_ensemble(config, final_dir, member_dirs, tokenizer, prepared, metrics)
    return metrics


def held_out_splits(splits):
    """Return the snapshot's validation + test pairs as train, and its train pairs as validation."""
    from datasets import concatenate_datasets

    from training.trainers.data import Splits

    held_out = [d for d in (splits.validation, splits.test) if d is not None and len(d)]
    if not held_out:
        raise ConfigError("train_on 'held_out' needs validation or test pairs in the snapshot")
    return Splits(
        kind=splits.kind,
        train=concatenate_datasets(held_out),
        validation=splits.train,
        dropped=splits.dropped,
    )


def _train_member(config, index, model_path, tokenizer, prepared, output_dir, logger) -> Path:
    """Train ensemble member ``index`` (seed + index) and return its saved model folder."""
    from dataclasses import replace

    member_config = replace(config, seed=config.seed + index, resume=False)
    member_out = output_dir / f"member-{index}"
    trainer = _trainer(member_config, model_path, tokenizer, prepared, member_out)
    logger.event("ensemble_member", member=index, seed=member_config.seed)
    logger.info(f"training ensemble member {index} (seed {member_config.seed})")
    trainer.train()
    model_dir = member_out / "model"
    trainer.save_model(str(model_dir))  # every process calls it; only the main one writes
    return model_dir


def _save_ensemble(config, final_dir, member_dirs, tokenizer, prepared, metrics) -> None:
    """Move the members under final/members/ and record their spread on the validation split."""
    import shutil

    members_dir = final_dir / MEMBERS_DIR
    members_dir.mkdir(exist_ok=True)
    for index, source in enumerate(member_dirs, start=1):
        target = members_dir / str(index)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(source), target)
    record: dict[str, Any] = {
        "size": config.ensemble_size,
        "seeds": [config.seed + i for i in range(config.ensemble_size)],
        "uncertainty": "std of the members' rewards of one answer",
    }
    validation = prepared.get("validation")
    if validation is not None and len(validation):
        scorer = RewardScorer(final_dir, device="cpu")
        ids = list(validation["chosen_ids"]) + list(validation["rejected_ids"])
        _, spread = scorer.score_ids_with_spread(ids)
        record["validation_mean_std"] = sum(spread) / len(spread)
        metrics["ensemble_validation_mean_std"] = record["validation_mean_std"]
    (final_dir / ENSEMBLE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _trainer(config, model_path, tokenizer, prepared, output_dir):
    """Build the soft-label reward trainer of one model on the prepared splits."""
    from trl import RewardConfig

    eval_dataset = prepared.get("validation")
    args = make_trl_config(
        RewardConfig,
        config,
        **trainer_kwargs(config, output_dir, has_eval=eval_dataset is not None),
        max_length=None,  # pairs were length-handled above; TRL would silently drop them
        # The collator reads only chosen_ids/rejected_ids/margin; "length" feeds the sampler.
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
        center_rewards_coefficient=config.center_rewards_coefficient,
        eos_token=tokenizer.eos_token,
        disable_dropout=True,
    )
    trainer = soft_reward_trainer_class()(
        model=model_path,
        args=args,
        data_collator=collate_pairs(tokenizer.pad_token_id),
        train_dataset=prepared["train"],
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=lora_config(config, "SEQ_CLS"),
    )
    return trainer
