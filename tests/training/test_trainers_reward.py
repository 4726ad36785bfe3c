"""Tests of the reward-model recipe (training.trainers.reward)."""

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from tests.training.conftest import (
    arithmetic_rows,
    assert_run_json_complete,
    last_logged,
    read_metrics,
    weights_changed,
)
from training.trainers import reward
from training.trainers.data import load_preferences
from training.trainers.run_log import RunLogger


def _config(model_dir, **overrides):
    values = {
        "model_name_or_path": str(model_dir),
        "max_steps": 8,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "logging_steps": 2,
        "save_steps": 4,
    }
    return reward.Config(**{**values, **overrides})


@pytest.fixture
def preference_snapshot(make_snapshot):
    # 16 held-out pairs = 2 full eval batches, so TRL's mean of batch means is the plain mean.
    return make_snapshot(
        train=arithmetic_rows(64, seed=1, with_extras=True),
        validation=arithmetic_rows(16, seed=2),
        test=arithmetic_rows(16, seed=3),
    )


def test_reward_model_learns_and_its_final_checkpoint_reproduces_the_logged_eval(
    tmp_path, tiny_reward_dir, preference_snapshot
):
    out = tmp_path / "run"
    metrics = reward.train(_config(tiny_reward_dir), preference_snapshot, out, None)

    assert metrics["global_step"] == 8
    assert metrics["eval_accuracy"] >= 0.8  # chance is 0.5
    assert weights_changed(
        tiny_reward_dir, out / "final", model_class=AutoModelForSequenceClassification
    )
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 4, 6, 8]
    assert (out / "checkpoint-8").is_dir()
    progress = json.loads((out / "progress.json").read_text())
    assert progress["fraction"] == 1.0 and progress["status"] == "finished"
    assert_run_json_complete(out, "reward")

    # The reloaded final model, scored independently, gives the numbers TRL logged.
    scorer = reward.RewardScorer(out / "final", device="cpu")
    held_out = reward.pairwise_accuracy(
        scorer, list(load_preferences(preference_snapshot).validation)
    )
    assert held_out["accuracy"] == pytest.approx(last_logged(out, "eval_accuracy"))
    assert held_out["margin"] == pytest.approx(last_logged(out, "eval_margin"), rel=1e-4)
    assert metrics["test_accuracy"] == pytest.approx(last_logged(out, "test_accuracy"))


def test_margin_and_centring_change_the_loss(tmp_path, tiny_reward_dir, preference_snapshot):
    plain = reward.train(_config(tiny_reward_dir, max_steps=2), preference_snapshot, tmp_path / "a")
    shaped = reward.train(
        _config(tiny_reward_dir, max_steps=2, use_margin=True, center_rewards_coefficient=0.01),
        preference_snapshot,
        tmp_path / "b",
    )
    assert shaped["train_loss"] != pytest.approx(plain["train_loss"])


def test_overlong_pairs_are_truncated_or_dropped_and_counted(
    tmp_path, tiny_reward_dir, make_snapshot
):
    rows = arithmetic_rows(16, seed=4)
    for row in rows[:4]:
        row["prompt"] = "Please think hard. " * 20 + row["prompt"]
    snapshot = make_snapshot(train=rows)

    kept = reward.train(
        _config(tiny_reward_dir, max_steps=1, max_length=48), snapshot, tmp_path / "a"
    )
    assert kept["train_truncated"] == 4 and kept["train_pairs_kept"] == 16
    dropped = reward.train(
        _config(tiny_reward_dir, max_steps=1, max_length=48, overlong="drop"),
        snapshot,
        tmp_path / "b",
    )
    assert dropped["train_dropped_overlong"] == 4 and dropped["train_pairs_kept"] == 12
    events = [r for r in read_metrics(tmp_path / "b") if r.get("event") == "preprocess"]
    assert events[0]["dropped_overlong"] == 4


def test_left_truncation_keeps_leading_special_tokens_and_the_end():
    assert reward.truncate_left([101, 1, 2, 3, 4, 102], 4, keep_first=1) == [101, 3, 4, 102]
    assert reward.truncate_left([1, 2, 3], 4, keep_first=1) == [1, 2, 3]


class _CrashAt(RunLogger):
    """Simulate a worker dying after ``step`` optimizer steps."""

    def __init__(self, output_dir, step):
        super().__init__(output_dir, echo=False)
        self.crash_step = step

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if state.global_step == self.crash_step:
            raise RuntimeError("simulated crash")


def test_resume_continues_from_the_last_checkpoint(tmp_path, tiny_reward_dir, preference_snapshot):
    config = _config(tiny_reward_dir, max_steps=6, save_steps=2, logging_steps=1)
    reward.train(config, preference_snapshot, tmp_path / "straight")

    out = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        reward.train(config, preference_snapshot, out, _CrashAt(out, 5))
    assert (out / "checkpoint-4").is_dir() and not (out / "final").exists()
    (out / "checkpoint-5").mkdir()  # a save cut short: no trainer_state.json, never resumed from
    config.resume = True
    metrics = reward.train(config, preference_snapshot, out, None)

    records = read_metrics(out)
    resumed_at = next(i for i, r in enumerate(records) if r.get("event") == "resume")
    assert records[resumed_at]["checkpoint"].endswith("checkpoint-4")
    steps_after = [r["step"] for r in records[resumed_at:] if "loss" in r]
    assert steps_after == [5, 6]  # continued, not restarted at 1
    assert metrics["global_step"] == 6
    # Same data order and optimizer state: the resumed run ends where the straight one did.
    a = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "straight/final"))
    b = AutoModelForSequenceClassification.from_pretrained(str(out / "final"))
    for key, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], value, rtol=1e-4, atol=1e-5)


def test_lora_reward_model_trains_the_head_and_saves_merged_and_adapter(
    tmp_path, tiny_reward_dir, preference_snapshot
):
    out = tmp_path / "lora"
    config = _config(tiny_reward_dir, max_steps=4, use_lora=True, lora_r=4, lora_alpha=8)
    config.lora_target_modules = ["c_attn"]
    metrics = reward.train(config, preference_snapshot, out)
    assert (out / "adapter" / "adapter_config.json").exists()
    assert weights_changed(
        tiny_reward_dir, out / "final", model_class=AutoModelForSequenceClassification
    )
    scorer = reward.RewardScorer(out / "final", device="cpu")
    held_out = reward.pairwise_accuracy(
        scorer, list(load_preferences(preference_snapshot).validation)
    )
    assert held_out["accuracy"] == pytest.approx(metrics["eval_accuracy"])


def test_conversational_pairs_train_through_the_chat_template(
    tmp_path, tiny_reward_dir, make_snapshot
):
    snapshot = make_snapshot(
        train=arithmetic_rows(32, conversational=True),
        validation=arithmetic_rows(8, seed=5, conversational=True),
    )
    out = tmp_path / "chat"
    metrics = reward.train(_config(tiny_reward_dir, max_steps=4), snapshot, out)
    scorer = reward.RewardScorer(out / "final", device="cpu")
    held_out = reward.pairwise_accuracy(scorer, list(load_preferences(snapshot).validation))
    assert held_out["margin"] == pytest.approx(metrics["eval_margin"], rel=1e-4)


def test_a_reward_model_can_start_from_a_causal_lm_policy(tmp_path, tiny_policy_dir, make_snapshot):
    snapshot = make_snapshot(train=arithmetic_rows(16), validation=arithmetic_rows(8, seed=1))
    out = tmp_path / "from_policy"
    metrics = reward.train(_config(tiny_policy_dir, max_steps=2), snapshot, out)
    model = AutoModelForSequenceClassification.from_pretrained(str(out / "final"))
    assert model.config.num_labels == 1
    assert metrics["global_step"] == 2
