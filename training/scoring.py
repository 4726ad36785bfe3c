"""Score answers with a trained reward model from a local folder (no Django).

Scores go through `training.trainers.reward.RewardScorer`, so a prompt and its answers are
tokenized exactly as the model saw them in training (chat template for conversations, the
saved truncation rules). Loaded models are kept per process. A model version's frozen
calibration (``eval_results["calibration"]``: temperature and normalisation) is read with
``reward_calibration`` and applied by the scorer.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.trainers.reward import Calibration


@lru_cache(maxsize=4)
def reward_scorer(model_path: str, calibration: Calibration | None = None):
    """Load (once per process) a saved reward model as a `RewardScorer`."""
    from training.trainers.reward import RewardScorer

    return RewardScorer(model_path, calibration=calibration)


def reward_calibration(eval_results: dict) -> Calibration | None:
    """Return the calibration frozen in a model version's ``eval_results``, or None.

    The temperature is ``calibration.temperature`` (fitted by ``evaluate_rm --save``); a
    frozen normalisation carries the temperature it was measured at, which then wins so the
    shift and scale stay those of the rewards they were measured on.
    """
    from training.trainers.reward import Calibration

    stored = eval_results.get("calibration") or {}
    normalisation = stored.get("normalisation")
    if normalisation:
        return Calibration(
            temperature=normalisation["temperature"],
            shift=normalisation["mean"],
            scale=normalisation["std"],
        )
    if stored.get("temperature"):
        return Calibration(temperature=stored["temperature"])
    return None


def reward_scores(
    model_path: str | Path,
    prompt: Any,
    answers: list[str],
    *,
    calibration: Calibration | None = None,
) -> list[float]:
    """Return the reward model's score of each answer to a prompt (text or chat messages)."""
    if not answers:
        return []
    if isinstance(prompt, list):
        completions: list[Any] = [[{"role": "assistant", "content": a}] for a in answers]
    else:
        completions = list(answers)
    scorer = reward_scorer(str(model_path), calibration)
    return scorer.score([prompt] * len(answers), completions)
