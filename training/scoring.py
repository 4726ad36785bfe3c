"""Score answers with a trained reward model from a local folder (no Django).

Scores go through `training.trainers.reward.RewardScorer`, so a prompt and its answers are
tokenized exactly as the model saw them in training (chat template for conversations, the
saved truncation rules). Loaded models are kept per process.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=4)
def reward_scorer(model_path: str):
    """Load (once per process) a saved reward model as a `RewardScorer`."""
    from training.trainers.reward import RewardScorer

    return RewardScorer(model_path)


def reward_scores(model_path: str | Path, prompt: Any, answers: list[str]) -> list[float]:
    """Return the reward model's score of each answer to a prompt (text or chat messages)."""
    if not answers:
        return []
    if isinstance(prompt, list):
        completions: list[Any] = [[{"role": "assistant", "content": a}] for a in answers]
    else:
        completions = list(answers)
    return reward_scorer(str(model_path)).score([prompt] * len(answers), completions)
