"""A seed ensemble of reward models: members saved with the model, their spread as uncertainty."""

import json
import shutil

import pytest

from tests.training.conftest import arithmetic_rows
from training.trainers import reward


def test_ensemble_scores_the_members_mean_and_records_their_spread(
    tmp_path, tiny_reward_dir, make_snapshot
):
    snapshot = make_snapshot(
        train=arithmetic_rows(32, seed=1), validation=arithmetic_rows(8, seed=2)
    )
    config = reward.Config(
        model_name_or_path=str(tiny_reward_dir),
        max_steps=4,
        learning_rate=1e-3,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        logging_steps=2,
        save_steps=100,
        ensemble_size=2,
    )
    metrics = reward.train(config, snapshot, tmp_path / "run")

    final = tmp_path / "run" / "final"
    record = json.loads((final / reward.ENSEMBLE_FILE).read_text())
    assert record["size"] == 2 and record["seeds"] == [config.seed, config.seed + 1]
    assert record["validation_mean_std"] > 0  # different seeds, different models
    assert metrics["ensemble_validation_mean_std"] == record["validation_mean_std"]

    # The ensemble's reward is the mean of its members, its uncertainty their std (|a - b| / 2).
    rows = arithmetic_rows(4, seed=3)
    prompts, answers = [r["prompt"] for r in rows], [r["chosen"] for r in rows]
    first = reward.RewardScorer(final, device="cpu")
    assert len(first.members) == 2
    mean, spread = first.score_with_spread(prompts, answers)
    # Member 0 alone is the final folder without its members.
    alone = tmp_path / "member-0"
    shutil.copytree(final, alone, ignore=shutil.ignore_patterns(reward.MEMBERS_DIR))
    member_0 = reward.RewardScorer(alone, device="cpu").score(prompts, answers)
    member_1 = reward.RewardScorer(final / reward.MEMBERS_DIR / "1", device="cpu").score(
        prompts, answers
    )
    assert mean == pytest.approx(
        [(a + b) / 2 for a, b in zip(member_0, member_1, strict=True)], rel=1e-5
    )
    assert spread == pytest.approx(
        [abs(a - b) / 2 for a, b in zip(member_0, member_1, strict=True)], rel=1e-4
    )
    assert first.score(prompts, answers) == pytest.approx(mean)
    with pytest.raises(reward.ConfigError, match="ensemble_size"):
        reward.Config(model_name_or_path=str(tiny_reward_dir), ensemble_size=0).validate()
