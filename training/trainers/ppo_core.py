"""The tensor maths of RLHF PPO, free of models and I/O so that each piece is tested alone.

Layout: a rollout holds ``B`` sequences; response tensors are ``[B, R]`` with one slot per
sampled action (token). Masks are boolean. ``action_mask`` is true for the sampled tokens up
to and including the stop token (EOS), false for the padding after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# All-reduce of a 1-D tensor of sums across processes; identity in a single process.
Reducer = Callable[[torch.Tensor], torch.Tensor]


def _no_reduce(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


# --------------------------------------------------------------------------- masks


@dataclass
class ResponseMasks:
    """The masks of a batch of sampled responses (``[B, R]`` unless stated)."""

    action_mask: torch.Tensor  # sampled tokens up to and including the stop token
    padding_mask: torch.Tensor  # slots after the stop token (or never sampled)
    done_mask: torch.Tensor  # true only at the terminal (last valid) action
    terminal_index: torch.Tensor  # [B] index of the last valid action
    ended: torch.Tensor  # [B] the response emitted a stop token
    truncated: torch.Tensor  # [B] the response hit max_new_tokens without a stop token
    empty: torch.Tensor  # [B] the first action was the stop token (no text)
    lengths: torch.Tensor  # [B] number of valid actions (the stop token included)


def build_response_masks(
    response_ids: torch.Tensor, stop_token_ids: list[int] | torch.Tensor
) -> ResponseMasks:
    """Return the masks of sampled responses: valid up to and including the first stop token.

    A response that never emits a stop token is truncated: all its ``R`` slots are valid
    actions and its terminal action is the last one. A stop token in the very last slot
    counts as ended, not truncated. A stop token as the first action is an empty response
    with exactly one action.
    """
    batch, width = response_ids.shape
    stops = torch.as_tensor(stop_token_ids, dtype=response_ids.dtype, device=response_ids.device)
    is_stop = torch.isin(response_ids, stops)
    ended = is_stop.any(dim=1)
    positions = torch.arange(width, device=response_ids.device).expand(batch, width)
    # First stop position, or width-1 for responses without a stop token.
    first_stop = (
        torch.where(is_stop, positions, torch.full_like(positions, width)).min(dim=1).values
    )
    terminal_index = torch.where(ended, first_stop, torch.full_like(first_stop, width - 1))
    action_mask = positions <= terminal_index[:, None]
    done_mask = positions == terminal_index[:, None]
    return ResponseMasks(
        action_mask=action_mask,
        padding_mask=~action_mask,
        done_mask=done_mask,
        terminal_index=terminal_index,
        ended=ended,
        truncated=~ended,
        empty=ended & (terminal_index == 0),
        lengths=action_mask.sum(dim=1),
    )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Return position ids that start at 0 on the first real token of a left-padded row."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


# --------------------------------------------------------------------------- statistics


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Return the mean of ``values`` where ``mask`` is true (0 when nothing is valid)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim=dim) / mask.sum(dim=dim).clamp(min=1.0)


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce: Reducer = _no_reduce,
) -> torch.Tensor:
    """Whiten ``values`` with the mean and variance of the valid entries only.

    Padding never enters the statistics and stays zero in the output. ``reduce`` sums the
    statistics across processes (global whitening); ``shift_mean=False`` only rescales and
    keeps the mean. The variance is the unbiased one over the valid entries.
    """
    maskf = mask.to(values.dtype)
    stats = torch.stack([(values * maskf).sum(), (values.square() * maskf).sum(), maskf.sum()])
    total, total_sq, count = reduce(stats).unbind()
    mean = total / count.clamp(min=1.0)
    variance = (total_sq - count * mean.square()).clamp(min=0.0) / (count - 1).clamp(min=1.0)
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * maskf


def masked_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> float:
    """Return the ``q`` quantile of the valid entries (nan when none is valid)."""
    selected = values[mask.bool()].float()
    if selected.numel() == 0:
        return float("nan")
    return float(torch.quantile(selected, q))


def explained_variance(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """Return 1 - Var[target - predicted] / Var[target] over valid entries (CleanRL's metric)."""
    target_var = masked_var(target, mask)
    if target_var <= 0:
        return float("nan")
    return float(1.0 - masked_var(target - predicted, mask) / target_var)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Return the population variance of the valid entries."""
    mean = masked_mean(values, mask)
    return float(masked_mean((values - mean).square(), mask))


class RunningMoments:
    """Running mean and standard deviation of every score seen (Chan et al. parallel update)."""

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.count = 0

    def update(self, values: torch.Tensor) -> None:
        """Fold a batch of values into the running statistics."""
        values = values.detach().double().flatten()
        n = values.numel()
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_var = float(values.var(unbiased=False))
        if self.count == 0:
            self.mean, self.var, self.count = batch_mean, batch_var, n
            return
        total = self.count + n
        delta = batch_mean - self.mean
        # Chan, Golub & LeVeque (1979): combine two populations' means and M2.
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        return self.var**0.5

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


# --------------------------------------------------------------------------- sampling


def warp_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    keep_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return the logits of the distribution actually sampled from (temperature, top-k, top-p).

    Removed tokens get -inf. ``keep_ids`` (same leading shape as ``logits`` minus the vocab
    axis) are never removed: when old/new log-probs of already sampled tokens are computed,
    the sampled token stays in the support even if float noise or a policy update would push
    it just outside the top-k/top-p set. Temperature, then top-k, then top-p, each as
    transformers' warpers do it (top-p drops the least likely tokens whose mass stays within
    1 - top_p).
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0 to define a sampling distribution")
    logits = logits.float() / temperature
    vocab = logits.shape[-1]
    remove = torch.zeros_like(logits, dtype=torch.bool)
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        remove |= logits < kth
    if top_p < 1.0:
        # Applied after top-k, as transformers chains its warpers.
        sorted_logits, sorted_idx = torch.sort(logits.masked_fill(remove, float("-inf")), dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cumulative <= (1.0 - top_p)
        sorted_remove[..., -1] = False  # keep at least the most likely token
        remove |= sorted_remove.scatter(-1, sorted_idx, sorted_remove)
    if keep_ids is not None:
        remove.scatter_(-1, keep_ids.unsqueeze(-1), False)
    return logits.masked_fill(remove, float("-inf"))


def selected_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Return log p(token) under ``softmax(logits)``, normalised over the whole vocabulary."""
    return logits.log_softmax(dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Return the categorical entropy of ``softmax(logits)`` (removed tokens contribute 0)."""
    logp = logits.log_softmax(dim=-1)
    p = logp.exp()
    # masked_fill before the product: 0 * -inf would poison the backward pass with nan.
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(dim=-1)


# --------------------------------------------------------------------------- rewards


def kl_per_token(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Return the per-token KL(pi || pi_ref) estimate on the sampled tokens.

    # k1 = log pi - log pi_ref (Ziegler et al. 2019 eq. 2); k3 = (r - 1) - log r with
    # r = pi_ref / pi, non-negative and unbiased (http://joschu.net/blog/kl-approx.html)
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}: use 'k1' or 'k3'")


def shape_rewards(
    scores: torch.Tensor,
    kl: torch.Tensor,
    masks: ResponseMasks,
    kl_coef: float,
) -> torch.Tensor:
    """Return per-action rewards: -kl_coef * KL on every valid action, score once at the end.

    # r_t = -beta * KL_t, plus the sequence score on the terminal action
    # (Ziegler et al. 2019 §2; Ouyang et al. 2022 eq. 2)
    """
    rewards = -kl_coef * kl * masks.action_mask.to(kl.dtype)
    rows = torch.arange(scores.shape[0], device=scores.device)
    rewards[rows, masks.terminal_index] += scores.to(rewards.dtype)
    return rewards


# --------------------------------------------------------------------------- advantages


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)`` by GAE over the valid actions of each response.

    # delta_t = r_t + gamma * V(s_{t+1}) - V(s_t); A_t = delta_t + gamma * lam * A_{t+1}
    # (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", eq. 16)
    The episode ends at the last valid action: nothing is bootstrapped past it, and padding
    slots get zero advantage and zero return. Valid actions must form a prefix of each row.
    """
    maskf = mask.to(values.dtype)
    values = values * maskf
    rewards = rewards * maskf
    width = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(width)):
        if t + 1 < width:
            next_valid = maskf[:, t + 1]
            next_value = values[:, t + 1]
        else:
            next_valid = torch.zeros_like(last)
            next_value = torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lam * last * next_valid) * maskf[:, t]
        advantages[:, t] = last
    returns = (advantages + values) * maskf
    return advantages, returns


# --------------------------------------------------------------------------- losses


def uncertainty_penalized(
    member_scores: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(mean - coef * std, mean, std)`` over ensemble members (dim 0) per sequence.

    Conservative ensemble reward (Coste et al. 2024, uncertainty-weighted optimisation); std is
    the population std of the members, in reward units, 0 for one member.
    """
    scores = member_scores.float()
    mean = scores.mean(dim=0)
    std = scores.std(dim=0, unbiased=False)
    return mean - coef * std, mean, std


def sft_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return the mean token NLL of ``labels`` under ``logits`` over ``mask`` (PPO-ptx term).

    ``logits[:, t]`` predicts ``labels[:, t]``; InstructGPT §3.5 eq. 2 adds
    gamma * E[log pi(x)] of pretraining/demonstration data to the RL objective.
    """
    logprobs = selected_logprobs(logits.float(), labels)
    return -masked_mean(logprobs, mask.to(logprobs.dtype))


@dataclass
class PolicyLoss:
    """The clipped policy loss of one micro-batch and its diagnostics."""

    loss: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
) -> PolicyLoss:
    """Return PPO's clipped surrogate loss averaged over valid actions.

    # L = -min(r A, clip(r, 1-eps, 1+eps) A), r = pi / pi_old (Schulman et al. 2017 eq. 7)
    """
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        # approx KL(pi_old || pi) k3 estimator: http://joschu.net/blog/kl-approx.html
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
        ratio_mean = masked_mean(ratio, mask)
    return PolicyLoss(loss, clip_fraction, approx_kl, ratio_mean)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(loss, clip_fraction)``: half the clipped squared error over valid actions.

    # L_V = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)
    # (Schulman et al. 2017, OpenAI baselines ppo2)
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_error > unclipped_error).float(), mask)
    return loss, clip_fraction


# --------------------------------------------------------------------------- KL controllers


class FixedKLController:
    """A constant KL coefficient beta."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep beta unchanged."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Adapt beta towards a target KL per sequence (Ziegler et al. 2019 §2.2).

    # e = clip(KL / KL_target - 1, -0.2, 0.2); beta <- beta * (1 + e * n_steps / horizon)
    # (Ziegler et al. 2019 eq. 3 with K_beta = n_steps / horizon, as in lm-human-preferences)
    """

    def __init__(self, kl_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError("the adaptive KL controller needs target > 0 and horizon > 0")
        self.value = kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move beta after a rollout whose mean KL per sequence was ``current_kl``."""
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]
        self.target = state["target"]
        self.horizon = state["horizon"]
