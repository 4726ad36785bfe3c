"""A held-out judge: the reward recipe learns from the validation and test splits only."""

import pytest

from tests.training.conftest import arithmetic_rows
from training.trainers import reward


def _config(tiny_reward_dir, **overrides):
    return reward.Config(
        model_name_or_path=str(tiny_reward_dir),
        max_steps=2,
        learning_rate=1e-3,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        logging_steps=1,
        save_steps=100,
        **overrides,
    )


def test_train_on_held_out_learns_from_validation_and_test_and_validates_on_train(
    tmp_path, tiny_reward_dir, make_snapshot
):
    # given a snapshot of 20 train, 6 validation and 4 test pairs
    snapshot = make_snapshot(
        train=arithmetic_rows(20, seed=1),
        validation=arithmetic_rows(6, seed=2),
        test=arithmetic_rows(4, seed=3),
    )

    # when a judge and an ordinary reward model are trained on it
    judge = reward.train(_config(tiny_reward_dir, train_on="held_out"), snapshot, tmp_path / "j")
    usual = reward.train(_config(tiny_reward_dir), snapshot, tmp_path / "u")

    # then the judge learnt from the 10 held-out pairs and was validated on the 20 train pairs
    assert judge["train_pairs_in"] == 10 and judge["validation_pairs_in"] == 20
    assert "test_pairs_in" not in judge  # the test pairs are its training data now
    assert usual["train_pairs_in"] == 20 and usual["validation_pairs_in"] == 6
    assert usual["test_pairs_in"] == 4


def test_train_on_held_out_without_held_out_pairs_is_refused(
    tmp_path, tiny_reward_dir, make_snapshot
):
    snapshot = make_snapshot(train=arithmetic_rows(8, seed=1))
    with pytest.raises(reward.ConfigError, match="held_out"):
        reward.train(_config(tiny_reward_dir, train_on="held_out"), snapshot, tmp_path / "j")
    assert not (tmp_path / "j" / "final").exists()
