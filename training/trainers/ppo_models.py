"""PPO models: the critic, the frozen-model helpers, the reward scorers, and their loading.

No Django here.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.trainers.common import ConfigError
from training.trainers.ppo_config import VALUE_HEAD_FILE, Config

# --------------------------------------------------------------------------- models


class ValueModel(nn.Module):
    """A critic: a transformer backbone and a linear head giving V(s_t) at every position."""

    def __init__(self, backbone: nn.Module, head: nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.get_text_config().hidden_size
        if head is None:
            head = nn.Linear(hidden, 1)
            # Value head init as in lm-human-preferences / TRL: std 1/sqrt(hidden + 1), bias 0.
            nn.init.normal_(head.weight, std=1.0 / math.sqrt(hidden + 1))
            nn.init.zeros_(head.bias)
        self.head = head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def save(self, directory: Path) -> None:
        """Save the backbone with save_pretrained and the head beside it."""
        directory.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(str(directory))
        torch.save(self.head.state_dict(), directory / VALUE_HEAD_FILE)

    @classmethod
    def load(cls, directory: str | Path) -> ValueModel:
        """Load a critic saved by ``save``, or a bare backbone folder (new head)."""
        from transformers import AutoModel

        directory = Path(directory)
        model = cls(AutoModel.from_pretrained(str(directory), dtype=torch.float32))
        head_path = directory / VALUE_HEAD_FILE
        if head_path.exists():
            model.head.load_state_dict(torch.load(head_path, weights_only=True))
        return model


def reward_head(model: nn.Module) -> nn.Linear | None:
    """Return the one-output linear head of a sequence classifier, if it has one."""
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear) and head.out_features == 1:
            return head
    return None


def value_from_reward_model(reward_model_dir: str | Path, calibration: Any = None) -> ValueModel:
    """Return a critic warm-started from a reward model: its backbone and its scalar head.

    With a ``calibration`` the head is rescaled to predict calibrated rewards, the units the
    critic's targets are in: w / (T * scale) and (b / T - shift) / scale.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    rm = AutoModelForSequenceClassification.from_pretrained(str(reward_model_dir), num_labels=1)
    rm_head = reward_head(rm)
    if rm_head is None:
        raise ConfigError(f"{reward_model_dir}: no one-output 'score'/'classifier' head to copy")
    head = nn.Linear(rm_head.in_features, 1)
    with torch.no_grad():
        head.weight.copy_(rm_head.weight)
        if rm_head.bias is not None:
            head.bias.copy_(rm_head.bias)
        else:
            head.bias.zero_()
        if calibration is not None:
            head.weight.div_(calibration.temperature * calibration.scale)
            head.bias.copy_(
                (head.bias / calibration.temperature - calibration.shift) / calibration.scale
            )
    backbone = AutoModel.from_pretrained(str(reward_model_dir), dtype=torch.float32)
    return ValueModel(backbone, head)


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def freeze(model: nn.Module) -> nn.Module:
    """Freeze a model in all three senses: eval mode, no gradients, no optimizer."""
    model.eval()
    model.requires_grad_(False)
    return model


def same_vocabulary(tokenizer_a, tokenizer_b) -> bool:
    """Return whether two tokenizers map every token to the same id."""
    return tokenizer_a.get_vocab() == tokenizer_b.get_vocab()


# --------------------------------------------------------------------------- rewards


class FunctionReward:
    """Score responses with a Python function ``f(prompt, response_text) -> float``."""

    def __init__(self, function: Callable[[Any, str], float], name: str = "") -> None:
        self.function = function
        self.name = name or getattr(function, "__name__", "reward_function")

    @classmethod
    def from_spec(cls, spec: str) -> FunctionReward:
        """Import ``package.module:function``."""
        module_name, _, attribute = spec.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import reward function {spec!r}: {exc}") from exc
        return cls(function, spec)

    def __call__(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        scores = [float(self.function(p, r)) for p, r in zip(prompts, responses, strict=True)]
        return torch.tensor(scores, dtype=torch.float32)


class ModelReward:
    """Score responses with a frozen reward model, formatting text exactly as it was trained.

    The reward recipe's ``RewardScorer`` re-encodes (prompt, response) with the reward
    model's own tokenizer and preprocessing; only text crosses from the policy.
    """

    def __init__(
        self, model_dir: str | Path, batch_size: int = 16, calibration: Any = None
    ) -> None:
        from training.trainers.reward import RewardScorer

        self.scorer = RewardScorer(model_dir, batch_size=batch_size, calibration=calibration)
        for member in self.scorer.members:
            freeze(member)
        self.tokenizer = self.scorer.tokenizer
        self.name = f"reward_model:{model_dir}"

    @staticmethod
    def _completions(prompts: Sequence[Any], responses: Sequence[str]) -> list[Any]:
        return [
            [{"role": "assistant", "content": r}] if isinstance(p, list) else r
            for p, r in zip(prompts, responses, strict=True)
        ]

    @property
    def n_members(self) -> int:
        return len(self.scorer.members)

    def member_scores(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        """Return every seed member's (calibrated) score, shape ``[members, B]``."""
        scores = self.scorer.member_scores(list(prompts), self._completions(prompts, responses))
        return torch.tensor(scores, dtype=torch.float32)

    def __call__(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        completions = self._completions(prompts, responses)
        return torch.tensor(self.scorer.score(list(prompts), completions), dtype=torch.float32)


class EnsembleReward:
    """Score responses with several reward models as one ensemble (every seed member counts).

    Called, it returns the members' mean; ``member_scores`` gives what the uncertainty penalty
    (Coste et al. 2024) needs.
    """

    def __init__(self, model_dirs: Sequence[str | Path], batch_size: int = 16) -> None:
        self.models = [ModelReward(d, batch_size=batch_size) for d in model_dirs]
        self.tokenizer = self.models[0].tokenizer
        self.name = "reward_ensemble:" + ",".join(str(d) for d in model_dirs)

    @property
    def n_members(self) -> int:
        return sum(model.n_members for model in self.models)

    def member_scores(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        """Return every member's score, shape ``[members, B]``."""
        return torch.cat([m.member_scores(prompts, responses) for m in self.models], dim=0)

    def __call__(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        return self.member_scores(prompts, responses).mean(dim=0)


def reward_calibration_of(config: Config):
    """Return the frozen ``Calibration`` the config names, or None."""
    if not config.reward_calibration:
        return None
    from training.trainers.reward import Calibration

    stored = config.reward_calibration
    return Calibration(
        temperature=float(stored["temperature"]),
        shift=float(stored["mean"]),
        scale=float(stored["std"]),
    )


def reward_normalisation_record(config: Config) -> dict[str, Any]:
    """Return which normalisation the run's scores get (written beside the checkpoints)."""
    if config.reward_calibration:
        return {"kind": "frozen", **config.reward_calibration}
    if config.normalize_score:
        return {"kind": "running", "detail": "mean/std of every raw score so far"}
    return {"kind": "none"}


RewardFn = Callable[[Sequence[Any], Sequence[str]], torch.Tensor]


def is_peft(model: nn.Module) -> bool:
    """Return whether a model is a PEFT (LoRA) model whose adapters can be disabled."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def merged_copy(peft_model: nn.Module) -> nn.Module:
    """Return a copy of a PEFT model with its adapters merged into the weights."""
    import copy

    return copy.deepcopy(peft_model).merge_and_unload()


def load_models(config: Config) -> dict[str, Any]:
    """Load tokenizer, policy, reference, reward and critic as the config names them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.trainers.model_paths import resolve_model_path

    policy_path = resolve_model_path(config.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_name_or_path or policy_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy = AutoModelForCausalLM.from_pretrained(policy_path, dtype=torch.float32)
    reference = None
    reference_path = config.reference_model_path or policy_path
    if config.use_lora:
        from peft import get_peft_model

        from training.trainers.common import lora_config

        policy = get_peft_model(policy, lora_config(config, "CAUSAL_LM"))
    if not config.use_lora or config.reference_model_path:
        reference = AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch.float32)

    batch_size = config.per_device_eval_batch_size
    if config.reward_function:
        reward: RewardFn = FunctionReward.from_spec(config.reward_function)
        reward_tokenizer = None
    elif config.reward_model_paths:
        reward = EnsembleReward(config.reward_model_paths, batch_size=batch_size)
        reward_tokenizer = reward.tokenizer
    else:
        reward = ModelReward(
            config.reward_model_path,
            batch_size=batch_size,
            calibration=reward_calibration_of(config),
        )
        reward_tokenizer = reward.tokenizer
    judge = None
    if config.judge_reward_model_path:
        judge = ModelReward(config.judge_reward_model_path, batch_size=batch_size)
    first_reward_path = config.reward_model_path or next(iter(config.reward_model_paths), "")

    value_init = config.value_init
    if config.value_model_path:
        value_model = ValueModel.load(config.value_model_path)
    else:
        can_use_reward = reward_tokenizer is not None and same_vocabulary(
            tokenizer, reward_tokenizer
        )
        if value_init == "reward" and not can_use_reward:
            raise ConfigError(
                "value_init='reward' needs a reward model with the policy's tokenizer: the "
                "critic reads the policy's token ids"
            )
        if value_init == "auto":
            value_init = "reward" if can_use_reward else "policy"
        if value_init == "reward":
            value_model = value_from_reward_model(first_reward_path, reward_calibration_of(config))
        else:
            from transformers import AutoModel

            value_model = ValueModel(AutoModel.from_pretrained(policy_path, dtype=torch.float32))
    return {
        "tokenizer": tokenizer,
        "policy": policy,
        "reference": reference,
        "reward": reward,
        "judge": judge,
        "value_model": value_model,
        "value_init": value_init if not config.value_model_path else "path",
    }
