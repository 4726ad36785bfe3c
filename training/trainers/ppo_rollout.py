"""PPO rollouts: prompt encoding, token-by-token sampling and the log-probs of what was sampled.

Log-probs are always those of the distribution actually sampled from (temperature, top-k,
top-p applied to the logits), so the PPO ratio is exactly 1 before the first optimizer step.
No Django here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.trainers import ppo_core as core
from training.trainers.common import ConfigError


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
    reward_mean: torch.Tensor | None = None  # [B] ensemble mean (an ensemble reward only)
    reward_std: torch.Tensor | None = None  # [B] ensemble std (an ensemble reward only)

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.masks.action_mask.long()], dim=1)

    def metrics(self) -> dict[str, float]:
        """Return the rollout-side metrics of one update (mean over this process's batch)."""
        masks = self.masks
        action = masks.action_mask
        kl_seq = self.kl.sum(dim=1)
        kl_penalty = (-self.kl_coef * self.kl).sum(dim=1)
        ensemble = {}
        if self.reward_std is not None:
            ensemble = {
                "reward/ensemble_mean": float(self.reward_mean.mean()),
                "reward/ensemble_std": float(self.reward_std.mean()),
            }
        return {
            **ensemble,
            "score/raw_mean": float(self.raw_scores.mean()),
            "score/raw_std": float(self.raw_scores.std()) if len(self.raw_scores) > 1 else 0.0,
            "score/used_mean": float(self.scores.mean()),
            "reward/kl_penalty_mean": float(kl_penalty.mean()),
            "reward/total_mean": float(self.rewards.sum(dim=1).mean()),
            "kl/token_mean": float(core.masked_mean(self.kl, action)),
            "kl/token_p95": core.masked_quantile(self.kl, action, 0.95),
            "kl/seq_mean": float(kl_seq.mean()),
            "kl/seq_p95": float(torch.quantile(kl_seq.float(), 0.95)),
            "kl_coef": self.kl_coef,
            "entropy/rollout": float(core.masked_mean(self.entropy, action)),
            "response/length_mean": float(masks.lengths.float().mean()),
            "response/eos_fraction": float(masks.ended.float().mean()),
            "response/truncated_fraction": float(masks.truncated.float().mean()),
            "response/empty_fraction": float(masks.empty.float().mean()),
            "response/filtered": int((self.loss_mask.sum(dim=1) == 0).sum()),
            "value/mean": float(core.masked_mean(self.values, action)),
            "value/returns_mean": float(core.masked_mean(self.returns, action)),
            "value/explained_variance": core.explained_variance(self.values, self.returns, action),
        }


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
