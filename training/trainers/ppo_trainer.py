"""PPO updates: ``PPOTrainer`` owns the four models and runs rollouts and PPO epochs.

See ``training.trainers.ppo`` for one update step by step, ``ppo_core`` for the maths.
No Django here.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.trainers import ppo_core as core
from training.trainers.common import ConfigError
from training.trainers.ppo_checkpoint import PPOCheckpointing
from training.trainers.ppo_config import SAMPLES_FILE, Config
from training.trainers.ppo_guards import PPOGuards
from training.trainers.ppo_models import RewardFn, ValueModel, disable_dropout, freeze, is_peft
from training.trainers.ppo_rollout import (
    Rollout,
    format_prompt,
    left_pad,
    prompt_token_ids,
    sample_tokens,
    sampled_logprobs,
)


class PPOTrainer(PPOCheckpointing, PPOGuards):
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
        judge: RewardFn | None = None,
        ptx_rows: list[dict] | None = None,
    ) -> None:
        from accelerate import Accelerator
        from transformers import get_scheduler

        self.config = config
        self.accelerator = accelerator or Accelerator(
            mixed_precision=config.accelerate_mixed_precision()
        )
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
        if reference is None and not is_peft(policy):
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
        self.setup_guards(judge=judge, ptx_rows=ptx_rows)

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
        raw_scores, reward_mean, reward_std = self.score_responses(prompts, texts)
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
            reward_mean=reward_mean,
            reward_std=reward_std,
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
            "ptx_loss": [],
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
                    if config.ptx_coef:
                        # PPO-ptx: + gamma * SFT loss (Ouyang et al. 2022 §3.5 eq. 2)
                        ptx = self.ptx_loss()
                        loss = loss + config.ptx_coef * ptx
                        stats["ptx_loss"].append(float(ptx.detach()))
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
        """Run one PPO update (rollout, epochs, KL controller); return its metrics.

        The rollout measures the weights before the update; when a guard stops there, no
        update is made and the metrics carry ``guard/stopped`` = 1.
        """
        started = time.perf_counter()
        prompts = self.next_prompts()
        rollout = self.make_rollout(prompts)
        rollout_seconds = time.perf_counter() - started
        kl_per_sequence = self._gather(rollout.kl.sum(dim=1))
        metrics = rollout.metrics()
        if self.guards_on and self.guard_boundary(float(kl_per_sequence.mean()), last=False):
            return {**metrics, "guard/stopped": 1}
        update_stats = self.optimize(rollout)
        metrics.update({f"ppo/{k}": v for k, v in update_stats.items()})
        # beta is adapted on the rollout's mean KL per sequence over all processes
        # (Ziegler et al. 2019 §2.2), so every process keeps the same beta.
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

    @torch.no_grad()
    def evaluate(
        self, prompts: list[Any], *, greedy: bool = True, reward: RewardFn | None = None
    ) -> dict[str, Any]:
        """Answer ``prompts`` (greedily by default); return mean score, length and samples.

        Scores come from ``reward`` (default: the training reward).
        """
        if not prompts:
            return {"score_mean": float("nan"), "samples": []}
        query_ids, query_mask = self.encode_prompts(prompts)
        generator = torch.Generator().manual_seed(self.config.seed)  # never the rollout stream
        response_ids = self.generate(query_ids, query_mask, greedy=greedy, generator=generator)
        masks = core.build_response_masks(response_ids, self.stop_ids)
        texts = self.decode(response_ids, masks)
        scores = (reward or self.reward)(prompts, texts)
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
        """Run updates until ``num_updates`` (default: the planned number) are done.

        A guard (KL budget, judge patience) may stop earlier: ``self.guard.stop_reason`` says
        why, and ``guards_finish`` puts the weights the guards chose in place.
        """
        target = num_updates if num_updates is not None else self.num_updates
        metrics: dict[str, float] = {}
        if self.logger is not None and hasattr(self.logger, "progress"):
            self.logger.progress(self.update_step, target)
        while self.update_step < target:
            metrics = self.step()
            if metrics.get("guard/stopped"):
                self._log_at(self.update_step, {"guard/stopped": 1})
                break
            if self.update_step % self.config.logging_steps == 0 or self.update_step == target:
                self._log(metrics)
                self._write_samples()
            if self.output_dir is not None and (
                self.update_step % self.config.save_steps == 0 or self.update_step == target
            ):
                self.save_checkpoint(self.output_dir / f"checkpoint-{self.update_step}")
        return metrics

    def _log(self, metrics: dict[str, Any]) -> None:
        self._log_at(self.update_step, metrics)

    def _log_at(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.accelerator.is_main_process:
            return
        if self.logger is not None:
            self.logger.log(metrics, step=step)
        elif self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with (self.output_dir / "metrics.jsonl").open("a") as fh:
                fh.write(json.dumps({"step": step, **metrics}) + "\n")

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
