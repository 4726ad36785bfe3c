"""PPO guards against reward hacking: PPO-ptx, the ensemble reward, a KL budget, a held-out judge.

- **PPO-ptx** (Ouyang et al. 2022, InstructGPT §3.5 eq. 2): every micro-batch's loss gains
  ``ptx_coef`` x the mean token NLL of demonstrations, here the chosen answers of the
  snapshot's train split (the preference export the reward model learned from).
- **Ensemble reward** (Coste et al. 2024): the score is mean - ``uncertainty_coef`` x std over
  the reward models' members (``ppo_core.uncertainty_penalized``).
- **KL budget**: the weights at each update boundary are measured by the next rollout's mean
  sequence KL to the reference (after the last update, by one more sample). Training stops at
  the first boundary over ``kl_budget``; the last boundary under it becomes final.
- **Held-out judge**: a reward model not trained on scores greedy answers to the validation
  prompts at boundaries 0, ``judge_every``, ... and the last; the best-judged weights (among
  those under the KL budget) become final, and ``judge_patience`` scores without a new best
  stop the run.

The weights kept for final/ are copies of the trainable parameters in memory (adapters only
for LoRA). A resumed run starts its guards afresh. No Django here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from training.trainers import ppo_core as core
from training.trainers.common import ConfigError
from training.trainers.ppo_rollout import format_prompt, prompt_token_ids


@dataclass
class GuardState:
    """What the guards decided so far (``summary`` is written beside the run)."""

    best_score: float | None = None
    best_update: int | None = None
    best_weights: dict[str, torch.Tensor] | None = None
    since_best: int = 0
    last_ok_update: int | None = None
    last_ok_weights: dict[str, torch.Tensor] | None = None
    last_kl: float | None = None
    stop_reason: str = ""
    judge_scores: list[tuple[int, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "stop_reason": self.stop_reason,
            "best_judge_score": self.best_score,
            "best_judge_update": self.best_update,
            "last_under_kl_budget_update": self.last_ok_update,
            "last_kl": self.last_kl,
            "judge_scores": [[u, s] for u, s in self.judge_scores],
        }


def ptx_examples(tokenizer, rows: list[dict], prompt_format: str, max_length: int | None):
    """Return ``(ids, loss_mask)`` per demonstration: prompt tokens unmasked, answer + eos masked.

    Rows are ``load_sft`` rows: ``{"prompt", "completion"}``, ``{"messages"}`` (the last
    assistant turn is the answer) or ``{"text"}`` (every token is learned).
    """
    examples = []
    for row in rows:
        if "text" in row:
            prompt, answer = None, row["text"]
        elif "messages" in row:
            messages = list(row["messages"])
            if not messages or messages[-1]["role"] != "assistant":
                continue
            prompt, answer = messages[:-1], messages[-1]["content"]
        else:
            prompt, answer = row["prompt"], row["completion"]
            if isinstance(answer, list):
                answer = "".join(str(m["content"]) for m in answer if m["role"] == "assistant")
        prompt_ids: list[int] = []
        if prompt:
            prompt_ids = prompt_token_ids(tokenizer, format_prompt(prompt, prompt_format))
        answer_ids = list(tokenizer(str(answer), add_special_tokens=False)["input_ids"])
        if tokenizer.eos_token_id is not None:
            answer_ids.append(tokenizer.eos_token_id)
        ids = prompt_ids + answer_ids
        mask = [0] * len(prompt_ids) + [1] * len(answer_ids)
        if max_length is not None and len(ids) > max_length:
            ids, mask = ids[-max_length:], mask[-max_length:]  # keep the answer's end
        if sum(mask[1:]):
            examples.append((ids, mask))
    return examples


class PPOGuards:
    """The guards of ``PPOTrainer`` (which supplies the attributes used)."""

    def setup_guards(self, *, judge, ptx_rows: list[dict] | None) -> None:
        """Check the guard settings against the data and prepare their state."""
        config = self.config
        self.judge = judge
        self.guard = GuardState()
        self.judge_prompt_list = self.eval_prompts[: config.judge_prompts]
        if judge is not None and not self.judge_prompt_list:
            raise ConfigError(
                "judge_reward_model_path needs held-out prompts: the snapshot has no "
                "validation split"
            )
        self.ptx_data = []
        if config.ptx_coef:
            self.ptx_data = ptx_examples(
                self.tokenizer, ptx_rows or [], config.prompt_format, config.max_length
            )
            if not self.ptx_data:
                raise ConfigError(
                    "ptx_coef needs demonstrations: the snapshot's train split has no chosen "
                    "answers (give a preference or SFT snapshot)"
                )
        self.ptx_epoch = 0
        self.ptx_offset = 0

    @property
    def guards_on(self) -> bool:
        return self.judge is not None or self.config.kl_budget is not None

    # ------------------------------------------------------------------ ensemble reward

    def score_responses(self, prompts: list[Any], texts: list[str]):
        """Return ``(score, ensemble mean, ensemble std)``; the last two None for one scorer."""
        reward = self.reward
        if getattr(reward, "n_members", 1) > 1 or hasattr(reward, "models"):
            members = reward.member_scores(prompts, texts)
            return core.uncertainty_penalized(members, self.config.uncertainty_coef)
        return self.reward(prompts, texts).float(), None, None

    # ------------------------------------------------------------------ PPO-ptx

    def next_ptx_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return right-padded ``(ids, attention_mask, loss_mask)`` of the next demonstrations."""
        size = self.config.per_device_train_batch_size
        chosen = []
        while len(chosen) < size:
            order = np.random.default_rng([self.config.seed, 7, self.ptx_epoch]).permutation(
                len(self.ptx_data)
            )
            take = min(size - len(chosen), len(order) - self.ptx_offset)
            chosen.extend(self.ptx_data[i] for i in order[self.ptx_offset : self.ptx_offset + take])
            self.ptx_offset += take
            if self.ptx_offset >= len(order):
                self.ptx_epoch += 1
                self.ptx_offset = 0
        width = max(len(ids) for ids, _ in chosen)
        ids = torch.full((len(chosen), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(chosen), width), dtype=torch.long)
        loss_mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, (row_ids, row_mask) in enumerate(chosen):
            ids[row, : len(row_ids)] = torch.tensor(row_ids)
            attention[row, : len(row_ids)] = 1
            loss_mask[row, : len(row_ids)] = torch.tensor(row_mask)
        return ids, attention, loss_mask

    def ptx_loss(self) -> torch.Tensor:
        """Return the policy's mean token NLL on the next demonstrations (with gradients)."""
        ids, attention, loss_mask = (t.to(self.device) for t in self.next_ptx_batch())
        with self.accelerator.autocast():
            logits = self.policy(input_ids=ids, attention_mask=attention).logits
        # the logits at t predict token t + 1
        return core.sft_loss(logits[:, :-1], ids[:, 1:], loss_mask[:, 1:])

    # ------------------------------------------------------------------ KL budget and judge

    def _weights(self) -> dict[str, torch.Tensor]:
        return {
            name: param.detach().cpu().clone()
            for name, param in self.unwrapped_policy.named_parameters()
            if param.requires_grad
        }

    def _restore(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, param in self.unwrapped_policy.named_parameters():
                if name in weights:
                    param.copy_(weights[name].to(param.device))

    @torch.no_grad()
    def measure_kl(self) -> float:
        """Return the mean sequence KL to the reference of the current policy on fresh samples."""
        query_ids, query_mask = self.encode_prompts(self.next_prompts())
        response_ids = self.generate(query_ids, query_mask)
        masks = core.build_response_masks(response_ids, self.stop_ids)
        sequences = torch.cat([query_ids, response_ids], dim=1)
        attention = torch.cat([query_mask, masks.action_mask.long()], dim=1)
        sums = []
        step = self.config.per_device_eval_batch_size
        for start in range(0, sequences.shape[0], step):
            rows = slice(start, start + step)
            seq, att = sequences[rows].to(self.device), attention[rows].to(self.device)
            resp = response_ids[rows].to(self.device)
            logprobs, _ = self.sequence_logprobs(self.unwrapped_policy, seq, att, resp)
            ref = self.reference_logprobs(seq, att, resp)
            kl = core.kl_per_token(logprobs.cpu(), ref.cpu(), self.config.kl_estimator)
            sums.append((kl * masks.action_mask[rows]).sum(dim=1))
        return float(self._gather(torch.cat(sums)).mean())

    def judge_score(self) -> tuple[float, float]:
        """Return the held-out judge's mean score of greedy answers to the validation prompts,
        and its standard error over the prompts (0 for a single prompt)."""
        result = self.evaluate(self.judge_prompt_list, reward=self.judge)
        scores = [sample["score"] for sample in result["samples"]]
        n = len(scores)
        sem = statistics.stdev(scores) / math.sqrt(n) if n > 1 else 0.0
        return float(result["score_mean"]), sem

    def guard_boundary(self, kl_seq: float | None, *, last: bool) -> bool:
        """Apply the guards to the current weights (update boundary); return True to stop."""
        config, guard, update = self.config, self.guard, self.update_step
        if config.kl_budget is not None and kl_seq is not None:
            guard.last_kl = kl_seq
            if kl_seq > config.kl_budget:
                guard.stop_reason = (
                    f"kl_budget: mean sequence KL {kl_seq:.3f} > {config.kl_budget:g} nats "
                    f"after update {update}"
                )
                return True
            guard.last_ok_update = update
            if self.judge is None:
                guard.last_ok_weights = self._weights()
        if self.judge is None or not (last or update % config.judge_every == 0):
            return False
        score, sem = self.judge_score()
        guard.judge_scores.append((update, score))
        if guard.best_score is None or score > guard.best_score:
            guard.best_score, guard.best_update = score, update
            guard.best_weights = self._weights()
            guard.since_best = 0
        else:
            guard.since_best += 1
        self._log_at(
            update,
            {
                "judge/score_mean": score,
                "judge/score_sem": sem,
                "judge/best_score": guard.best_score,
                "judge/best_update": guard.best_update,
            },
        )
        if config.judge_patience and guard.since_best >= config.judge_patience:
            guard.stop_reason = (
                f"judge_patience: {guard.since_best} judge scores without a new best "
                f"(best {guard.best_score:.4f} after update {guard.best_update})"
            )
            return True
        return False

    def guards_finish(self, stopped: bool) -> dict[str, Any]:
        """Check the last weights, put the weights the guards chose in place; return a summary."""
        guard = self.guard
        if not stopped and self.guards_on:
            kl = self.measure_kl() if self.config.kl_budget is not None else None
            self.guard_boundary(kl, last=True)
        final_update = self.update_step
        if guard.best_weights is not None:
            final_update = guard.best_update
            self._restore(guard.best_weights)
        elif guard.last_ok_weights is not None and guard.last_ok_update != self.update_step:
            final_update = guard.last_ok_update
            self._restore(guard.last_ok_weights)
        elif guard.stop_reason.startswith("kl_budget") and guard.last_ok_update is None:
            final_update = None  # not even the first weights were under the budget
        summary = {**guard.summary(), "final_update": final_update}
        if self.logger is not None and hasattr(self.logger, "event"):
            self.logger.event("guards", **summary)
        return summary
