"""Tests of the SFT recipe (training.trainers.sft)."""

import pytest

from tests.training.conftest import (
    arithmetic_rows,
    assert_run_json_complete,
    last_logged,
    read_metrics,
    weights_changed,
)
from training.trainers import sft
from training.trainers.data import load_sft


def _config(model_dir, **overrides):
    values = {
        "model_name_or_path": str(model_dir),
        "max_steps": 6,
        "learning_rate": 2e-3,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "logging_steps": 2,
        "save_steps": 3,
        "group_by_length": False,
    }
    return sft.Config(**{**values, **overrides})


def _messages(rows):
    return [{"messages": row["prompt"] + row["chosen"]} for row in rows]


def _reevaluate(final_dir, snapshot, config):
    """Return eval_loss of the reloaded final model, measured by a fresh SFTTrainer."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    splits = load_sft(snapshot)
    trainer = SFTTrainer(
        model=str(final_dir),
        args=SFTConfig(
            output_dir=str(final_dir.parent / "reeval"),
            per_device_eval_batch_size=config.per_device_eval_batch_size,
            assistant_only_loss="messages" in splits.train.column_names,
            bf16=False,
            report_to="none",
        ),
        train_dataset=splits.train,
        eval_dataset=splits.validation,
        processing_class=AutoTokenizer.from_pretrained(str(final_dir)),
    )
    return trainer.evaluate()["eval_loss"]


@pytest.mark.parametrize("layout", ["messages", "prompt_completion", "from_preferences"])
def test_sft_lowers_the_loss_and_the_final_checkpoint_reproduces_the_logged_eval(
    tmp_path, tiny_policy_dir, make_snapshot, layout
):
    train, validation = (
        arithmetic_rows(48, seed=1, conversational=True),
        arithmetic_rows(16, seed=2, conversational=True),
    )
    if layout == "messages":
        train, validation = _messages(train), _messages(validation)
    elif layout == "prompt_completion":
        train = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in train]
        validation = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in validation]
    snapshot = make_snapshot(train=train, validation=validation)
    out = tmp_path / "run"
    config = _config(tiny_policy_dir)
    metrics = sft.train(config, snapshot, out, None)

    losses = [r["loss"] for r in read_metrics(out) if "loss" in r]
    assert losses[-1] < losses[0]
    assert weights_changed(tiny_policy_dir, out / "final")
    assert (out / "checkpoint-6").is_dir()
    assert_run_json_complete(out, "sft")
    run_event = next(r for r in read_metrics(out) if r.get("event") == "data")
    assert run_event["assistant_only_loss"] is (layout == "messages")

    reloaded = _reevaluate(out / "final", snapshot, config)
    assert reloaded == pytest.approx(last_logged(out, "eval_loss"), rel=1e-4)
    assert metrics["eval_loss"] == pytest.approx(reloaded, rel=1e-4)


def test_assistant_only_loss_ignores_the_user_turn(tiny_tokenizer):
    row = _messages(arithmetic_rows(1, conversational=True))[0]
    out = tiny_tokenizer.apply_chat_template(
        row["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert 0 < sum(out["assistant_masks"]) < len(out["input_ids"])


def test_resume_continues_from_the_last_checkpoint(tmp_path, tiny_policy_dir, make_snapshot):
    snapshot = make_snapshot(train=_messages(arithmetic_rows(48, seed=1, conversational=True)))
    out = tmp_path / "run"
    sft.train(_config(tiny_policy_dir, max_steps=3, logging_steps=1), snapshot, out)
    metrics = sft.train(
        _config(tiny_policy_dir, max_steps=5, logging_steps=1, resume=True), snapshot, out
    )
    records = read_metrics(out)
    resumed_at = next(i for i, r in enumerate(records) if r.get("event") == "resume")
    assert [r["step"] for r in records[resumed_at:] if "loss" in r] == [4, 5]
    assert metrics["global_step"] == 5


def test_group_by_length_sampling_runs(tmp_path, tiny_policy_dir, make_snapshot):
    snapshot = make_snapshot(train=_messages(arithmetic_rows(16, conversational=True)))
    metrics = sft.train(
        _config(tiny_policy_dir, max_steps=2, group_by_length=True), snapshot, tmp_path
    )
    assert metrics["global_step"] == 2
