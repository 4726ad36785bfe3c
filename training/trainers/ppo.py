"""RLHF PPO recipe: a trainable policy, a frozen reference, a frozen reward, a separate critic.

TRL 1.16 has no PPO trainer, so this module owns one. One *update* is:

1. take the next ``rollout_batch_size`` prompts (left-padded) and sample one response each
   from the policy with the recorded sampling settings, keeping the exact sampled token ids;
2. score the rollout without gradients: old log-probs (policy), reference log-probs, values,
   and the sequence score (reward model or Python function; the reward model reads text
   decoded and re-encoded with its own tokenizer, the policy's actions are never re-encoded);
3. shape per-token rewards: -beta * KL on every action, the (transformed) score once on the
   last valid action; GAE(gamma, lambda) over the valid actions; whiten the advantages;
4. run ``num_ppo_epochs`` epochs of shuffled mini-batches (gradient accumulation over
   micro-batches) with the clipped policy loss, the clipped value loss and an optional
   entropy bonus; clip gradient norms;
5. update the KL controller, log, and at update boundaries write checkpoints.

Log-probs are always those of the distribution actually sampled from (temperature, top-k,
top-p applied to the logits), so the ratio is exactly 1 before the first optimizer step.

Checkpoints: ``checkpoint-N/`` is an inference checkpoint (``from_pretrained`` loads the
policy, tokenizer and generation config) with ``ppo_state/`` beside it holding what a resume
needs (critic, optimizers, schedulers, KL controller, score statistics, RNG states, update
step and data position). ``final/`` holds the last policy.

No Django here. Formulas carry their source; see ``ppo_core`` for the maths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.trainers import ppo_core as core
from training.trainers.common import (
    BaseRecipeConfig,
    ConfigError,
)
from training.trainers.provenance import library_versions, write_run_json
from training.trainers.run_log import atomic_write_json

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
    """PPO settings. Defaults follow InstructGPT / Ziegler et al. 2019 / seed 004 §7-§8."""

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
            "(reward when possible, else policy). Seed 004 §8.1."
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
            "(ratio exactly 1 before the first step; seed 004 §8.1)."
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
        metadata={"help": "Top-k sampling (0 = off, the usual PPO choice; seed 004 §7.1)."},
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "Top-p sampling (1.0 = off, the usual PPO choice; seed 004 §7.1)."},
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
        default=0.2, metadata={"help": "Value clip around the rollout's values (seed 004 §8.5)."}
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
        if bool(self.reward_model_path) == bool(self.reward_function):
            raise ConfigError("give exactly one of reward_model_path and reward_function")
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


def value_from_reward_model(reward_model_dir: str | Path) -> ValueModel:
    """Return a critic warm-started from a reward model: its backbone and its scalar head."""
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
    backbone = AutoModel.from_pretrained(str(reward_model_dir), dtype=torch.float32)
    return ValueModel(backbone, head)


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def freeze(model: nn.Module) -> nn.Module:
    """Freeze a model in all three senses of seed 004 §8.1: eval mode, no grads, no optimizer."""
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

    def __init__(self, model_dir: str | Path, batch_size: int = 16) -> None:
        from training.trainers.reward import RewardScorer

        self.scorer = RewardScorer(model_dir, batch_size=batch_size)
        freeze(self.scorer.model)
        self.tokenizer = self.scorer.tokenizer
        self.name = f"reward_model:{model_dir}"

    def __call__(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        completions = [
            [{"role": "assistant", "content": r}] if isinstance(p, list) else r
            for p, r in zip(prompts, responses, strict=True)
        ]
        return torch.tensor(self.scorer.score(list(prompts), completions), dtype=torch.float32)


RewardFn = Callable[[Sequence[Any], Sequence[str]], torch.Tensor]


# --------------------------------------------------------------------------- rollout


@dataclass
class Rollout:
    """One batch of sampled responses and everything the PPO epochs keep fixed."""

    prompts: list[Any]
    query_ids: torch.Tensor  # [B, P] left-padded prompts
    query_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, R] sampled tokens, pad after the stop token
    masks: core.ResponseMasks
    loss_mask: torch.Tensor  # [B, R] action_mask minus filtered responses
    texts: list[str]
    logprobs: torch.Tensor  # [B, R] old log-probs under the sampling distribution
    ref_logprobs: torch.Tensor  # [B, R]
    entropy: torch.Tensor  # [B, R] entropy of the sampling distribution
    values: torch.Tensor  # [B, R] old values V(s_t)
    raw_scores: torch.Tensor  # [B] reward model / function output
    scores: torch.Tensor  # [B] after normalisation, clipping and the missing-EOS penalty
    kl: torch.Tensor  # [B, R] per-token KL estimate (masked)
    kl_coef: float
    rewards: torch.Tensor  # [B, R] shaped rewards fed to GAE
    advantages: torch.Tensor  # [B, R] (whitened when configured)
    returns: torch.Tensor  # [B, R]

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.masks.action_mask.long()], dim=1)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(ids, mask)`` of sequences padded on the left to the longest."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def format_prompt(prompt: Any, prompt_format: str) -> Any:
    """Return the prompt in the form both the policy and the reward will see."""
    if prompt_format == "chat" and isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if prompt_format == "plain" and isinstance(prompt, list):
        return "\n".join(str(m["content"]) for m in prompt)
    return prompt


def prompt_token_ids(tokenizer, prompt: Any) -> list[int]:
    """Return the policy's token ids for a prompt (chat template with the generation prompt)."""
    if isinstance(prompt, list):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("conversational prompts need a tokenizer with a chat template")
        encoded = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


@torch.no_grad()
def sample_tokens(
    model: nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
) -> torch.Tensor:
    """Sample responses token by token with a KV cache; return the sampled ids ``[B, R]``.

    Each token is drawn from ``warp_logits`` of the logits (the distribution the log-probs
    use); ``greedy`` takes the argmax instead. Rows that emitted a stop token get the pad id
    afterwards, and sampling ends when every row has stopped or after ``max_new_tokens``.
    """
    batch = query_ids.shape[0]
    stops = torch.tensor(list(stop_ids), device=query_ids.device)
    position_ids = core.position_ids_from_mask(query_mask)
    attention = query_mask
    with autocast():
        out = model(
            input_ids=query_ids, attention_mask=attention, position_ids=position_ids, use_cache=True
        )
    cache, logits = out.cache, out.logits[:, -1]
    next_position = position_ids[:, -1:] + 1
    finished = torch.zeros(batch, dtype=torch.bool, device=query_ids.device)
    tokens = []
    for _ in range(max_new_tokens):
        if greedy:
            token = logits.float().argmax(dim=-1)
        else:
            warped = core.warp_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
            probs = warped.softmax(dim=-1).cpu()
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            token = token.to(query_ids.device)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        tokens.append(token)
        finished |= torch.isin(token, stops)
        if bool(finished.all()):
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        with autocast():
            out = model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=next_position,
                cache=cache,
                use_cache=True,
            )
        cache, logits = out.cache, out.logits[:, -1]
        next_position = next_position + 1
    return torch.stack(tokens, dim=1).cpu()


def sampled_logprobs(
    model: nn.Module,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    response_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    with_entropy: bool = False,
    autocast: Callable[[], Any] = contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return log-probs (and entropy) of the response tokens under the sampling distribution.

    ``sequences`` is left-padded prompt + response. The logits at position ``P - 1 + t``
    predict response token ``t``; they are tempered and warped as in ``sample_tokens``, with
    the sampled token kept in the support.
    """
    prompt_len = sequences.shape[1] - response_ids.shape[1]
    with autocast():
        logits = model(
            input_ids=sequences,
            attention_mask=attention_mask,
            position_ids=core.position_ids_from_mask(attention_mask),
        ).logits
    logits = logits[:, prompt_len - 1 : -1]
    warped = core.warp_logits(
        logits, temperature=temperature, top_k=top_k, top_p=top_p, keep_ids=response_ids
    )
    logprobs = core.selected_logprobs(warped, response_ids)
    entropy = core.entropy_from_logits(warped) if with_entropy else None
    return logprobs, entropy


@dataclass
class Generation:
    """Responses sampled from a policy, with the exact token ids and masks."""

    prompts: list[Any]
    texts: list[str]
    query_ids: torch.Tensor
    query_mask: torch.Tensor
    response_ids: torch.Tensor
    masks: core.ResponseMasks

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.masks.action_mask.long()], dim=1)


@torch.no_grad()
def generate_responses(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    seed: int = 0,
    batch_size: int = 64,
    stop_token_ids: Sequence[int] = (),
) -> Generation:
    """Answer ``prompts`` with ``model`` (for evaluation): text, token ids and masks."""
    stop_ids = sorted({tokenizer.eos_token_id, *stop_token_ids} - {None})
    encoded = [prompt_token_ids(tokenizer, p) for p in prompts]
    query_ids, query_mask = left_pad(encoded, tokenizer.pad_token_id)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    chunks = []
    for start in range(0, len(encoded), batch_size):
        rows = slice(start, start + batch_size)
        chunks.append(
            sample_tokens(
                model,
                query_ids[rows].to(device),
                query_mask[rows].to(device),
                max_new_tokens=max_new_tokens,
                stop_ids=stop_ids,
                pad_id=tokenizer.pad_token_id,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                greedy=greedy,
                generator=generator,
            )
        )
    width = max(chunk.shape[1] for chunk in chunks)
    response_ids = torch.cat(
        [
            nn.functional.pad(c, (0, width - c.shape[1]), value=tokenizer.pad_token_id)
            for c in chunks
        ]
    )
    masks = core.build_response_masks(response_ids, stop_ids)
    texts = [
        tokenizer.decode(ids[: int(n)].tolist(), skip_special_tokens=True)
        for ids, n in zip(response_ids, masks.lengths, strict=True)
    ]
    return Generation(list(prompts), texts, query_ids, query_mask, response_ids, masks)


@torch.no_grad()
def sequence_logprob_sums(
    model: nn.Module, generation: Generation, *, temperature: float = 1.0, batch_size: int = 64
) -> torch.Tensor:
    """Return log pi(y | x) summed over each response's valid tokens, shape ``[B]``.

    The difference of two models' sums on samples from the first is a Monte Carlo estimate
    of their sequence KL (Ziegler et al. 2019 §2.2).
    """
    device = next(model.parameters()).device
    sums = []
    for start in range(0, generation.response_ids.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        logprobs, _ = sampled_logprobs(
            model,
            generation.sequences[rows].to(device),
            generation.attention_mask[rows].to(device),
            generation.response_ids[rows].to(device),
            temperature=temperature,
        )
        mask = generation.masks.action_mask[rows].to(device)
        sums.append((logprobs * mask).sum(dim=1).cpu())
    return torch.cat(sums)


class PPOTrainer:
    """Own the four models and run PPO updates; see the module docstring for one update."""

    def __init__(
        self,
        config: Config,
        *,
        policy: nn.Module,
        tokenizer,
        reward: RewardFn,
        value_model: ValueModel,
        train_prompts: list[Any],
        reference: nn.Module | None = None,
        eval_prompts: list[Any] | None = None,
        output_dir: str | Path | None = None,
        logger: Any = None,
        accelerator=None,
    ) -> None:
        from accelerate import Accelerator
        from transformers import get_scheduler

        self.config = config
        self.accelerator = accelerator or Accelerator(mixed_precision=_mixed_precision(config))
        self.device = self.accelerator.device
        self.tokenizer = tokenizer
        self.reward = reward
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.logger = logger
        if tokenizer.pad_token_id is None:
            raise ConfigError("the policy tokenizer needs a pad token")
        if tokenizer.eos_token_id is None and not config.stop_token_ids:
            raise ConfigError("the policy tokenizer has no eos token: give stop_token_ids")
        self.pad_id = tokenizer.pad_token_id
        stop_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_ids = sorted(set(stop_ids) | set(config.stop_token_ids))

        self.train_prompts = [format_prompt(p, config.prompt_format) for p in train_prompts]
        self.eval_prompts = [format_prompt(p, config.prompt_format) for p in eval_prompts or []]
        if not self.train_prompts:
            raise ConfigError("no training prompts")
        self.sample_prompts = self.train_prompts[: config.num_sample_prompts]
        self.prompt_cache: dict[str, list[int]] = {}

        if config.disable_dropout:
            disable_dropout(policy)
            disable_dropout(value_model)
        if config.activation_checkpointing and hasattr(policy, "gradient_checkpointing_enable"):
            policy.gradient_checkpointing_enable()
        policy.train()
        value_model.train()
        if reference is None and not _is_peft(policy):
            raise ConfigError("a reference model is required unless the policy is a LoRA model")
        self.reference = freeze(reference).to(self.device) if reference is not None else None

        policy_params = [p for p in policy.parameters() if p.requires_grad]
        self.policy_optimizer = torch.optim.AdamW(
            policy_params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.value_optimizer = torch.optim.AdamW(
            value_model.parameters(),
            lr=config.value_learning_rate or config.learning_rate,
            weight_decay=config.weight_decay,
        )
        self.num_updates = self.planned_updates(len(self.train_prompts))
        steps_per_update = config.num_ppo_epochs * math.ceil(
            config.rollout_batch_size / config.mini_batch_size
        )
        total_steps = self.num_updates * steps_per_update
        warmup = math.floor(total_steps * config.warmup_ratio)
        self.policy_scheduler = get_scheduler(
            config.lr_scheduler_type, self.policy_optimizer, warmup, total_steps
        )
        self.value_scheduler = get_scheduler(
            config.lr_scheduler_type, self.value_optimizer, warmup, total_steps
        )
        self.policy, self.value_model, self.policy_optimizer, self.value_optimizer = (
            self.accelerator.prepare(
                policy, value_model, self.policy_optimizer, self.value_optimizer
            )
        )

        if config.adaptive_kl:
            self.kl_controller = core.AdaptiveKLController(
                config.kl_coef, config.target_kl, config.kl_horizon
            )
        else:
            self.kl_controller = core.FixedKLController(config.kl_coef)
        self.score_moments = core.RunningMoments()

        seed = config.seed + 1000 * self.accelerator.process_index
        self.rollout_generator = torch.Generator().manual_seed(seed)
        self.shuffle_generator = torch.Generator().manual_seed(seed + 1)
        self.update_step = 0
        self.data_epoch = 0
        self.data_offset = 0
        self.episodes = 0

    # ---------------------------------------------------------------- plumbing

    def planned_updates(self, n_prompts: int) -> int:
        """Return the number of updates this run will make."""
        if self.config.max_steps > 0:
            return self.config.max_steps
        per_update = self.config.rollout_batch_size * self.accelerator.num_processes
        return max(1, math.ceil(self.config.num_train_epochs * n_prompts / per_update))

    @property
    def unwrapped_policy(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.policy)

    @property
    def unwrapped_value(self) -> ValueModel:
        return self.accelerator.unwrap_model(self.value_model)

    def _reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over processes (identity in a single process)."""
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor.to(self.device), reduction="sum").cpu()

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a per-sequence tensor over processes (identity in a single process)."""
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.gather(tensor.to(self.device)).cpu()

    def next_prompts(self) -> list[Any]:
        """Return this process's prompts for the next update and advance the data position.

        Prompts are read in a fresh permutation per pass (seeded by seed and pass number), so
        the data position (pass, offset) alone resumes the order.
        """
        n_total = len(self.train_prompts)
        global_batch = self.config.rollout_batch_size * self.accelerator.num_processes
        chosen: list[Any] = []
        while len(chosen) < global_batch:
            order = np.random.default_rng([self.config.seed, self.data_epoch]).permutation(n_total)
            take = min(global_batch - len(chosen), n_total - self.data_offset)
            indices = order[self.data_offset : self.data_offset + take]
            chosen.extend(self.train_prompts[i] for i in indices)
            self.data_offset += take
            if self.data_offset >= n_total:
                self.data_epoch += 1
                self.data_offset = 0
        start = self.config.rollout_batch_size * self.accelerator.process_index
        return chosen[start : start + self.config.rollout_batch_size]

    def encode_prompts(self, prompts: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return left-padded prompt ids and mask, prompts cut from the left to fit."""
        limit = None
        if self.config.max_length is not None:
            limit = self.config.max_length - self.config.max_new_tokens
        encoded = []
        for prompt in prompts:
            key = json.dumps(prompt, sort_keys=True)
            if key not in self.prompt_cache:
                self.prompt_cache[key] = prompt_token_ids(self.tokenizer, prompt)
            ids = self.prompt_cache[key]
            if not ids:
                raise ConfigError(f"prompt {prompt!r} encodes to no tokens")
            encoded.append(ids[-limit:] if limit is not None and len(ids) > limit else ids)
        return left_pad(encoded, self.pad_id)

    # ---------------------------------------------------------------- sampling

    @torch.no_grad()
    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
    ) -> torch.Tensor:
        """Sample responses token by token (KV cache) and return their exact token ids ``[B, R]``.

        Each token is drawn from ``warp_logits`` of the policy's logits, the same distribution
        the log-probs use. Slots after a stop token hold the pad id.
        """
        model = model or self.unwrapped_policy
        chunks = []
        step = self.config.per_device_eval_batch_size
        for start in range(0, query_ids.shape[0], step):
            chunks.append(
                self._generate_chunk(
                    model,
                    query_ids[start : start + step].to(self.device),
                    query_mask[start : start + step].to(self.device),
                    greedy=greedy,
                    generator=generator or self.rollout_generator,
                )
            )
        width = max(chunk.shape[1] for chunk in chunks)
        padded = [
            nn.functional.pad(chunk, (0, width - chunk.shape[1]), value=self.pad_id)
            for chunk in chunks
        ]
        return torch.cat(padded, dim=0)

    def _generate_chunk(self, model, query_ids, query_mask, *, greedy, generator) -> torch.Tensor:
        return sample_tokens(
            model,
            query_ids,
            query_mask,
            max_new_tokens=self.config.max_new_tokens,
            temperature=self.config.temperature,
            top_k=self.config.top_k,
            top_p=self.config.top_p,
            stop_ids=self.stop_ids,
            pad_id=self.pad_id,
            greedy=greedy,
            generator=generator,
            autocast=self.accelerator.autocast,
        )

    # ---------------------------------------------------------------- scoring

    def sequence_logprobs(
        self,
        model: nn.Module,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        response_ids: torch.Tensor,
        *,
        with_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return log-probs (and entropy) of the response tokens under the sampling distribution.

        The logits at position ``P - 1 + t`` predict response token ``t``; they are tempered and
        warped exactly as in ``generate`` with the sampled token kept in the support.
        """
        return sampled_logprobs(
            model,
            sequences,
            attention_mask,
            response_ids,
            temperature=self.config.temperature,
            top_k=self.config.top_k,
            top_p=self.config.top_p,
            with_entropy=with_entropy,
            autocast=self.accelerator.autocast,
        )

    def sequence_values(self, sequences: torch.Tensor, attention_mask: torch.Tensor, width: int):
        """Return V(s_t) for each response slot: the critic at the position before token t."""
        prompt_len = sequences.shape[1] - width
        with self.accelerator.autocast():
            values = self.value_model(
                input_ids=sequences,
                attention_mask=attention_mask,
                position_ids=core.position_ids_from_mask(attention_mask),
            )
        return values[:, prompt_len - 1 : -1].float()

    @torch.no_grad()
    def reference_logprobs(self, sequences, attention_mask, response_ids) -> torch.Tensor:
        """Return the frozen reference's log-probs (adapters disabled for a LoRA policy)."""
        if self.reference is not None:
            logprobs, _ = self.sequence_logprobs(
                self.reference, sequences, attention_mask, response_ids
            )
            return logprobs
        policy = self.unwrapped_policy
        with policy.disable_adapter():
            logprobs, _ = self.sequence_logprobs(policy, sequences, attention_mask, response_ids)
        return logprobs

    def decode(self, response_ids: torch.Tensor, masks: core.ResponseMasks) -> list[str]:
        """Return the response texts (up to the stop token, special tokens dropped)."""
        return [
            self.tokenizer.decode(ids[: int(n)].tolist(), skip_special_tokens=True)
            for ids, n in zip(response_ids, masks.lengths, strict=True)
        ]

    def transform_scores(self, raw: torch.Tensor, masks: core.ResponseMasks) -> torch.Tensor:
        """Return scores after normalisation/clipping (in the configured order) and penalties."""
        config = self.config
        scores = raw.clone().float()

        def normalize(values: torch.Tensor) -> torch.Tensor:
            if not config.normalize_score:
                return values
            self.score_moments.update(self._gather(values))  # the same statistics everywhere
            return (values - self.score_moments.mean) / (self.score_moments.std + 1e-8)

        def clip(values: torch.Tensor) -> torch.Tensor:
            if config.score_clip is None:
                return values
            return values.clamp(-config.score_clip, config.score_clip)

        if config.score_transform_order == "normalize_then_clip":
            scores = clip(normalize(scores))
        else:
            scores = normalize(clip(scores))
        if config.missing_eos == "penalty":
            scores = scores - config.missing_eos_penalty * masks.truncated.float()
        return scores

    @torch.no_grad()
    def make_rollout(self, prompts: list[Any]) -> Rollout:
        """Sample responses to ``prompts`` and compute everything the PPO epochs keep fixed."""
        config = self.config
        query_ids, query_mask = self.encode_prompts(prompts)
        response_ids = self.generate(query_ids, query_mask)
        masks = core.build_response_masks(response_ids, self.stop_ids)
        loss_mask = masks.action_mask.clone()
        if config.missing_eos == "filter":
            loss_mask &= ~masks.truncated[:, None]
        sequences = torch.cat([query_ids, response_ids], dim=1)
        attention_mask = torch.cat([query_mask, masks.action_mask.long()], dim=1)

        logprobs, ref_logprobs, values, entropy = [], [], [], []
        step = config.per_device_eval_batch_size
        for start in range(0, sequences.shape[0], step):
            rows = slice(start, start + step)
            seq = sequences[rows].to(self.device)
            att = attention_mask[rows].to(self.device)
            resp = response_ids[rows].to(self.device)
            lp, ent = self.sequence_logprobs(
                self.unwrapped_policy, seq, att, resp, with_entropy=True
            )
            logprobs.append(lp.cpu())
            entropy.append(ent.cpu())
            ref_logprobs.append(self.reference_logprobs(seq, att, resp).cpu())
            values.append(self.sequence_values(seq, att, resp.shape[1]).cpu())
        logprobs = torch.cat(logprobs)
        ref_logprobs = torch.cat(ref_logprobs)
        values = torch.cat(values)
        entropy = torch.cat(entropy)

        texts = self.decode(response_ids, masks)
        raw_scores = self.reward(prompts, texts).float()
        scores = self.transform_scores(raw_scores, masks)
        action = masks.action_mask
        kl = core.kl_per_token(logprobs, ref_logprobs, config.kl_estimator) * action
        kl_coef = self.kl_controller.value
        rewards = core.shape_rewards(scores, kl, masks, kl_coef)
        if config.whiten_rewards:
            rewards = core.masked_whiten(rewards, loss_mask, shift_mean=False, reduce=self._reduce)
        advantages, returns = core.compute_gae(
            rewards, values, action, gamma=config.gamma, lam=config.lam
        )
        if config.whiten_advantages:
            advantages = core.masked_whiten(advantages, loss_mask, reduce=self._reduce)
        advantages = advantages * loss_mask
        return Rollout(
            prompts=list(prompts),
            query_ids=query_ids,
            query_mask=query_mask,
            response_ids=response_ids,
            masks=masks,
            loss_mask=loss_mask,
            texts=texts,
            logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
            values=values * action,
            raw_scores=raw_scores,
            scores=scores,
            kl=kl,
            kl_coef=kl_coef,
            rewards=rewards,
            advantages=advantages,
            returns=returns,
        )

    # ---------------------------------------------------------------- optimisation

    def optimize(self, rollout: Rollout) -> dict[str, float]:
        """Run the PPO epochs over one rollout; return the update's mean statistics."""
        config = self.config
        accelerator = self.accelerator
        batch = rollout.response_ids.shape[0]
        sequences, attention_mask = rollout.sequences, rollout.attention_mask
        stats: dict[str, list[float]] = {
            "policy_loss": [],
            "value_loss": [],
            "clip_fraction": [],
            "value_clip_fraction": [],
            "approx_kl": [],
            "ratio_mean": [],
            "entropy": [],
            "policy_grad_norm": [],
            "value_grad_norm": [],
        }
        for _ in range(config.num_ppo_epochs):
            order = torch.randperm(batch, generator=self.shuffle_generator)
            for mb_start in range(0, batch, config.mini_batch_size):
                mini = order[mb_start : mb_start + config.mini_batch_size]
                micro_batches = mini.split(config.per_device_train_batch_size)
                for micro in micro_batches:
                    mask = rollout.loss_mask[micro].to(self.device)
                    seq = sequences[micro].to(self.device)
                    att = attention_mask[micro].to(self.device)
                    resp = rollout.response_ids[micro].to(self.device)
                    logprobs, entropy = self.sequence_logprobs(
                        self.policy, seq, att, resp, with_entropy=True
                    )
                    values = self.sequence_values(seq, att, resp.shape[1])
                    policy = core.clipped_policy_loss(
                        logprobs,
                        rollout.logprobs[micro].to(self.device),
                        rollout.advantages[micro].to(self.device),
                        mask,
                        config.cliprange,
                    )
                    value_loss, value_clip = core.clipped_value_loss(
                        values,
                        rollout.values[micro].to(self.device),
                        rollout.returns[micro].to(self.device),
                        mask,
                        config.cliprange_value,
                    )
                    mean_entropy = core.masked_mean(entropy, mask)
                    # L = L_clip + c_V * L_V - c_H * H (Schulman et al. 2017 eq. 9)
                    loss = policy.loss + config.vf_coef * value_loss
                    if config.entropy_coef:
                        loss = loss - config.entropy_coef * mean_entropy
                    accelerator.backward(loss / len(micro_batches))
                    stats["policy_loss"].append(float(policy.loss.detach()))
                    stats["value_loss"].append(float(value_loss.detach()))
                    stats["clip_fraction"].append(float(policy.clip_fraction))
                    stats["value_clip_fraction"].append(float(value_clip))
                    stats["approx_kl"].append(float(policy.approx_kl))
                    stats["ratio_mean"].append(float(policy.ratio_mean))
                    stats["entropy"].append(float(mean_entropy.detach()))
                stats["policy_grad_norm"].append(self._clip(self.policy))
                stats["value_grad_norm"].append(self._clip(self.value_model))
                self.policy_optimizer.step()
                self.value_optimizer.step()
                self.policy_scheduler.step()
                self.value_scheduler.step()
                self.policy_optimizer.zero_grad(set_to_none=True)
                self.value_optimizer.zero_grad(set_to_none=True)
        return {key: float(np.mean(values)) for key, values in stats.items() if values}

    def _clip(self, model: nn.Module) -> float:
        params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        return float(self.accelerator.clip_grad_norm_(params, max_norm))

    # ---------------------------------------------------------------- the loop

    def step(self) -> dict[str, float]:
        """Run one PPO update (rollout, epochs, KL controller); return its metrics."""
        started = time.perf_counter()
        prompts = self.next_prompts()
        rollout = self.make_rollout(prompts)
        rollout_seconds = time.perf_counter() - started
        update_stats = self.optimize(rollout)
        metrics = self.rollout_metrics(rollout)
        metrics.update({f"ppo/{k}": v for k, v in update_stats.items()})
        # beta is adapted on the rollout's mean KL per sequence over all processes
        # (Ziegler et al. 2019 §2.2), so every process keeps the same beta.
        kl_per_sequence = self._gather(rollout.kl.sum(dim=1))
        self.kl_controller.update(float(kl_per_sequence.mean()), kl_per_sequence.numel())
        if self.accelerator.num_processes > 1:  # the headline numbers over every process
            metrics["kl/seq_mean"] = float(kl_per_sequence.mean())
            metrics["score/raw_mean"] = float(self._gather(rollout.raw_scores).mean())
        self.update_step += 1
        self.episodes += rollout.response_ids.shape[0] * self.accelerator.num_processes
        metrics.update(
            {
                "kl_coef_next": self.kl_controller.value,
                "lr": self.policy_scheduler.get_last_lr()[0],
                "episodes": self.episodes,
                "data_epoch": self.data_epoch + self.data_offset / len(self.train_prompts),
                "time/rollout_s": rollout_seconds,
                "time/update_s": time.perf_counter() - started,
            }
        )
        return metrics

    def rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        """Return the rollout-side metrics of one update (mean over this process's batch)."""
        masks = rollout.masks
        action = masks.action_mask
        kl_seq = rollout.kl.sum(dim=1)
        kl_penalty = (-rollout.kl_coef * rollout.kl).sum(dim=1)
        return {
            "score/raw_mean": float(rollout.raw_scores.mean()),
            "score/raw_std": float(rollout.raw_scores.std())
            if len(rollout.raw_scores) > 1
            else 0.0,
            "score/used_mean": float(rollout.scores.mean()),
            "reward/kl_penalty_mean": float(kl_penalty.mean()),
            "reward/total_mean": float(rollout.rewards.sum(dim=1).mean()),
            "kl/token_mean": float(core.masked_mean(rollout.kl, action)),
            "kl/token_p95": core.masked_quantile(rollout.kl, action, 0.95),
            "kl/seq_mean": float(kl_seq.mean()),
            "kl/seq_p95": float(torch.quantile(kl_seq.float(), 0.95)),
            "kl_coef": rollout.kl_coef,
            "entropy/rollout": float(core.masked_mean(rollout.entropy, action)),
            "response/length_mean": float(masks.lengths.float().mean()),
            "response/eos_fraction": float(masks.ended.float().mean()),
            "response/truncated_fraction": float(masks.truncated.float().mean()),
            "response/empty_fraction": float(masks.empty.float().mean()),
            "response/filtered": int((rollout.loss_mask.sum(dim=1) == 0).sum()),
            "value/mean": float(core.masked_mean(rollout.values, action)),
            "value/returns_mean": float(core.masked_mean(rollout.returns, action)),
            "value/explained_variance": core.explained_variance(
                rollout.values, rollout.returns, action
            ),
        }

    @torch.no_grad()
    def evaluate(self, prompts: list[Any], *, greedy: bool = True) -> dict[str, Any]:
        """Answer ``prompts`` (greedily by default) and return mean score, length and samples."""
        if not prompts:
            return {"score_mean": float("nan"), "samples": []}
        query_ids, query_mask = self.encode_prompts(prompts)
        generator = torch.Generator().manual_seed(self.config.seed)  # never the rollout stream
        response_ids = self.generate(query_ids, query_mask, greedy=greedy, generator=generator)
        masks = core.build_response_masks(response_ids, self.stop_ids)
        texts = self.decode(response_ids, masks)
        scores = self.reward(prompts, texts)
        samples = [
            {"prompt": p, "response": t, "score": float(s)}
            for p, t, s in zip(prompts, texts, scores, strict=True)
        ]
        return {
            "score_mean": float(scores.mean()),
            "length_mean": float(masks.lengths.float().mean()),
            "eos_fraction": float(masks.ended.float().mean()),
            "samples": samples,
        }

    def train(self, num_updates: int | None = None) -> dict[str, float]:
        """Run updates until ``num_updates`` (default: the planned number) are done."""
        target = num_updates if num_updates is not None else self.num_updates
        metrics: dict[str, float] = {}
        if self.logger is not None and hasattr(self.logger, "progress"):
            self.logger.progress(self.update_step, target)
        while self.update_step < target:
            metrics = self.step()
            if self.update_step % self.config.logging_steps == 0 or self.update_step == target:
                self._log(metrics)
                self._write_samples()
            if self.output_dir is not None and (
                self.update_step % self.config.save_steps == 0 or self.update_step == target
            ):
                self.save_checkpoint(self.output_dir / f"checkpoint-{self.update_step}")
        return metrics

    def _log(self, metrics: dict[str, Any]) -> None:
        if not self.accelerator.is_main_process:
            return
        if self.logger is not None:
            self.logger.log(metrics, step=self.update_step)
        elif self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with (self.output_dir / "metrics.jsonl").open("a") as fh:
                fh.write(json.dumps({"step": self.update_step, **metrics}) + "\n")

    def _write_samples(self) -> None:
        if self.output_dir is None or not self.sample_prompts:
            return
        result = self.evaluate(self.sample_prompts)
        if not self.accelerator.is_main_process:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.output_dir / SAMPLES_FILE).open("a") as fh:
            for sample in result["samples"]:
                fh.write(json.dumps({"step": self.update_step, **sample}) + "\n")

    # ---------------------------------------------------------------- checkpoints

    def generation_config(self):
        """Return the generation config that reproduces the rollout sampling."""
        from transformers import GenerationConfig

        config = self.config
        return GenerationConfig(
            do_sample=True,
            temperature=config.temperature,
            top_k=config.top_k if config.top_k > 0 else None,
            top_p=config.top_p,
            max_new_tokens=config.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            bos_token_id=self.tokenizer.bos_token_id,
        )

    def save_policy(self, directory: Path) -> None:
        """Write an inference checkpoint: policy (LoRA merged), tokenizer, generation config."""
        directory.mkdir(parents=True, exist_ok=True)
        policy = self.unwrapped_policy
        if _is_peft(policy):
            policy.save_pretrained(str(directory / "adapter"))
            merged = _merged_copy(policy)
            merged.generation_config = self.generation_config()
            merged.save_pretrained(str(directory))
        else:
            original = policy.generation_config
            policy.generation_config = self.generation_config()
            policy.save_pretrained(str(directory))
            policy.generation_config = original
        self.tokenizer.save_pretrained(str(directory))

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write ``directory`` (inference checkpoint) and its ``ppo_state/`` (resume state).

        The folder is written under a temporary name and renamed, so a crash never leaves a
        half-written checkpoint-N that a resume would pick.
        """
        directory = Path(directory)
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            return directory
        tmp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.save_policy(tmp)
        state_dir = tmp / STATE_DIR
        self.unwrapped_value.save(state_dir / "value_model")
        torch.save(self.policy_optimizer.state_dict(), state_dir / "policy_optimizer.pt")
        torch.save(self.value_optimizer.state_dict(), state_dir / "value_optimizer.pt")
        torch.save(self.policy_scheduler.state_dict(), state_dir / "policy_scheduler.pt")
        torch.save(self.value_scheduler.state_dict(), state_dir / "value_scheduler.pt")
        torch.save(self.rng_state(), state_dir / "rng_state.pt")
        atomic_write_json(state_dir / "trainer_state.json", self.trainer_state())
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
        if self.logger is not None and hasattr(self.logger, "event"):
            self.logger.event("checkpoint", path=str(directory), update=self.update_step)
        self._prune_checkpoints(directory.parent)
        return directory

    def _prune_checkpoints(self, parent: Path) -> None:
        limit = self.config.save_total_limit
        if not limit:
            return
        found = sorted(
            (int(p.name.split("-")[1]), p)
            for p in parent.glob("checkpoint-*")
            if p.is_dir() and p.name.split("-")[1].isdigit()
        )
        for _, path in found[:-limit]:
            shutil.rmtree(path, ignore_errors=True)

    def trainer_state(self) -> dict[str, Any]:
        """Return the JSON part of the resume state."""
        return {
            "recipe": RECIPE,
            "update_step": self.update_step,
            "episodes": self.episodes,
            "data_epoch": self.data_epoch,
            "data_offset": self.data_offset,
            "num_train_prompts": len(self.train_prompts),
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.score_moments.state_dict(),
            "sampling": self.config.sampling_settings(),
            "stop_token_ids": self.stop_ids,
            "config": dataclasses.asdict(self.config),
            "versions": library_versions(),
            "world_size": self.accelerator.num_processes,
        }

    def rng_state(self) -> dict[str, Any]:
        """Return every random state a resume must restore."""
        # numpy's state is stored as plain values and a tensor so that the file loads with
        # torch.load(weights_only=True), which refuses arbitrary pickled objects.
        kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
        state = {
            "python": random.getstate(),
            "numpy": {
                "kind": str(kind),
                "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
            "torch": torch.get_rng_state(),
            "rollout_generator": self.rollout_generator.get_state(),
            "shuffle_generator": self.shuffle_generator.get_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore the full training state from a ``checkpoint-N`` folder."""
        directory = Path(directory)
        state_dir = directory / STATE_DIR
        if not (state_dir / "trainer_state.json").exists():
            raise ConfigError(f"{directory} is not a resumable PPO checkpoint (no {STATE_DIR}/)")
        state = json.loads((state_dir / "trainer_state.json").read_text())
        if state["num_train_prompts"] != len(self.train_prompts):
            raise ConfigError(
                f"{directory}: saved with {state['num_train_prompts']} training prompts, the "
                f"dataset now has {len(self.train_prompts)}; the data position would not match"
            )
        policy = self.unwrapped_policy
        if _is_peft(policy):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            adapter = load_file(str(directory / "adapter" / "adapter_model.safetensors"))
            set_peft_model_state_dict(policy, adapter)
        else:
            from transformers import AutoModelForCausalLM

            saved = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
            policy.load_state_dict(saved.state_dict())
        saved_value = ValueModel.load(state_dir / "value_model")
        self.unwrapped_value.load_state_dict(saved_value.state_dict())

        def load(name: str):
            return torch.load(state_dir / name, weights_only=True)

        self.policy_optimizer.load_state_dict(load("policy_optimizer.pt"))
        self.value_optimizer.load_state_dict(load("value_optimizer.pt"))
        self.policy_scheduler.load_state_dict(load("policy_scheduler.pt"))
        self.value_scheduler.load_state_dict(load("value_scheduler.pt"))
        rng = load("rng_state.pt")
        random.setstate(rng["python"])
        saved_numpy = rng["numpy"]
        np.random.set_state(
            (
                saved_numpy["kind"],
                saved_numpy["keys"].numpy().astype(np.uint32),
                saved_numpy["position"],
                saved_numpy["has_gauss"],
                saved_numpy["cached_gaussian"],
            )
        )
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.rollout_generator.set_state(rng["rollout_generator"])
        self.shuffle_generator.set_state(rng["shuffle_generator"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.score_moments.load_state_dict(state["score_moments"])
        self.update_step = state["update_step"]
        self.episodes = state["episodes"]
        self.data_epoch = state["data_epoch"]
        self.data_offset = state["data_offset"]


def _is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def _merged_copy(peft_model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(peft_model).merge_and_unload()


def _mixed_precision(config: Config) -> str:
    if config.mixed_precision != "auto":
        return config.mixed_precision
    from training.trainers.common import use_bf16

    return "bf16" if use_bf16() else "no"


# --------------------------------------------------------------------------- entry point


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

    if config.reward_function:
        reward: RewardFn = FunctionReward.from_spec(config.reward_function)
        reward_tokenizer = None
    else:
        reward = ModelReward(config.reward_model_path, batch_size=config.per_device_eval_batch_size)
        reward_tokenizer = reward.tokenizer

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
            value_model = value_from_reward_model(config.reward_model_path)
        else:
            from transformers import AutoModel

            value_model = ValueModel(AutoModel.from_pretrained(policy_path, dtype=torch.float32))
    return {
        "tokenizer": tokenizer,
        "policy": policy,
        "reference": reference,
        "reward": reward,
        "value_model": value_model,
        "value_init": value_init if not config.value_model_path else "path",
    }


def train(
    config: Config,
    dataset_dir: Path,
    output_dir: Path,
    logger: Any = None,
) -> dict[str, Any]:
    """Run PPO on the prompts of a snapshot; write checkpoints and final/; return final metrics.

    ``logger`` is a ``RunLogger`` (or anything with ``log(metrics, step=...)``); None makes a
    RunLogger writing metrics.jsonl and progress.json into ``output_dir``.
    """
    from training.trainers.checkpoints import newest_complete_checkpoint
    from training.trainers.common import start_run
    from training.trainers.data import load_prompts

    dataset_dir, output_dir, logger = start_run(RECIPE, config, dataset_dir, output_dir, logger)
    splits = load_prompts(dataset_dir)
    train_prompts = list(splits.train["prompt"])
    eval_prompts = list(splits.validation["prompt"]) if splits.validation is not None else []
    models = load_models(config)
    trainer = PPOTrainer(
        config,
        policy=models["policy"],
        tokenizer=models["tokenizer"],
        reward=models["reward"],
        value_model=models["value_model"],
        reference=models["reference"],
        train_prompts=train_prompts,
        eval_prompts=eval_prompts,
        output_dir=output_dir,
        logger=logger,
    )
    if hasattr(logger, "event"):
        logger.event("value_init", value_init=models["value_init"])
    checkpoint = config.resume_from_checkpoint or (
        (newest_complete_checkpoint(output_dir) or (None,))[0] if config.resume else None
    )
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        if hasattr(logger, "event"):
            logger.event("resume", checkpoint=str(checkpoint), update=trainer.update_step)

    started = time.perf_counter()
    start_step = trainer.update_step
    last = trainer.train()
    seconds = time.perf_counter() - started
    metrics: dict[str, Any] = {
        "global_step": trainer.update_step,
        "updates": trainer.update_step,
        "episodes": trainer.episodes,
        "kl_coef": trainer.kl_controller.value,
        "train_runtime": seconds,
        "seconds_per_update": seconds / max(1, trainer.update_step - start_step),
        **{f"last_{k}": v for k, v in last.items()},
    }
    if config.evaluate_at_end and trainer.eval_prompts:
        result = trainer.evaluate(trainer.eval_prompts)
        metrics["eval_score_mean"] = result["score_mean"]
        metrics["eval_length_mean"] = result["length_mean"]
        metrics["eval_eos_fraction"] = result["eos_fraction"]

    final_dir = output_dir / "final"
    if trainer.accelerator.is_main_process:
        trainer.save_policy(final_dir)
    if hasattr(logger, "event"):
        logger.event("final", **metrics)
    if hasattr(logger, "finish"):
        logger.finish(**{k: v for k, v in metrics.items() if isinstance(v, int | float)})
    if trainer.accelerator.is_main_process:
        write_run_json(
            output_dir,
            config,
            dataset_dir,
            config.seeds(),
            recipe=RECIPE,
            status="finished",
            sampling=config.sampling_settings(),
            value_init=models["value_init"],
            final_dir=str(final_dir),
            final_metrics=metrics,
        )
    return metrics
