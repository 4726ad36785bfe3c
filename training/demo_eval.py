"""Score a policy on the demo domain's held-out prompts with the true reward (no Django)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from training import demo
from training.generation import GenerationSettings, generate_candidates


def bootstrap_mean_ci(
    values: list[float], *, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """Return (mean, low, high): a percentile bootstrap CI of the mean (Efron & Tibshirani 1993)."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(n_boot, len(data)))].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(data.mean()), float(low), float(high)


def held_out_prompts(n: int | None = None) -> list[str]:
    """Return the demo domain's held-out prompts (all of them, or the first n)."""
    prompts = [p.prompt for p in demo.problems_in("held_out")]
    return prompts if n is None else prompts[:n]


def policy_true_reward(
    model_path: str | Path,
    *,
    prompts: list[str] | None = None,
    samples_per_prompt: int = 2,
    temperature: float = 0.7,
    max_new_tokens: int = 24,
    seed: int = 0,
) -> dict:
    """Return the mean true reward of sampled answers on held-out prompts, with a 95% CI.

    The CI is clustered by prompt: each prompt's samples are averaged first, then prompts are
    resampled, so several samples of one prompt do not pass for independent evidence.
    """
    prompts = prompts or held_out_prompts()
    settings = GenerationSettings(
        temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, batch_size=64
    )
    samples = generate_candidates(model_path, prompts, k=samples_per_prompt, settings=settings)
    per_prompt = [
        float(np.mean([demo.true_reward(p, c["text"]) for c in cands]))
        for p, cands in zip(prompts, samples, strict=True)
    ]
    correct = [
        float(
            np.mean([demo.stated_answer(c["text"]) == demo.parse_prompt(p).answer for c in cands])
        )
        for p, cands in zip(prompts, samples, strict=True)
    ]
    mean, low, high = bootstrap_mean_ci(per_prompt, seed=seed)
    example = random.Random(seed).randrange(len(prompts))
    return {
        "true_reward": mean,
        "true_reward_ci95": [low, high],
        "accuracy": float(np.mean(correct)),
        "n_prompts": len(prompts),
        "samples_per_prompt": samples_per_prompt,
        "example": {"prompt": prompts[example], "answer": samples[example][0]["text"]},
    }
