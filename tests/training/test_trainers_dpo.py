"""Tests of the DPO recipe (training.trainers.dpo)."""

import pytest

from tests.training.conftest import (
    arithmetic_rows,
    assert_run_json_complete,
    last_logged,
    read_metrics,
    weights_changed,
)
from training.trainers import dpo
from training.trainers.data import load_preferences


def _config(model_dir, **overrides):
    values = {
        "model_name_or_path": str(model_dir),
        "max_steps": 6,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "logging_steps": 2,
        "save_steps": 3,
    }
    return dpo.Config(**{**values, **overrides})


@pytest.mark.parametrize("conversational", [False, True])
def test_dpo_moves_the_policy_and_the_final_checkpoint_reproduces_the_logged_eval(
    tmp_path, tiny_policy_dir, make_snapshot, conversational
):
    snapshot = make_snapshot(
        train=arithmetic_rows(48, seed=1, conversational=conversational),
        validation=arithmetic_rows(16, seed=2, conversational=conversational),
    )
    out = tmp_path / "run"
    metrics = dpo.train(_config(tiny_policy_dir), snapshot, out, None)

    assert metrics["global_step"] == 6
    assert metrics["loss_type"] == "sigmoid" and metrics["label_smoothing"] == 0.0
    assert metrics["eval_rewards/accuracies"] > 0.5
    assert weights_changed(tiny_policy_dir, out / "final")
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 4, 6]
    assert (out / "checkpoint-6").is_dir()
    assert_run_json_complete(out, "dpo")

    # Implicit rewards recomputed from the reloaded policy and the reference.
    rows = list(load_preferences(snapshot).validation)
    rewards = dpo.implicit_rewards(out / "final", tiny_policy_dir, rows, beta=0.1)
    accuracy = sum(c > r for c, r in rewards) / len(rewards)
    margin = sum(c - r for c, r in rewards) / len(rewards)
    assert accuracy == pytest.approx(last_logged(out, "eval_rewards/accuracies"))
    assert margin == pytest.approx(last_logged(out, "eval_rewards/margins"), rel=1e-3, abs=1e-5)


def test_soft_labels_turn_on_robust_dpo_with_their_flip_rate(
    tmp_path, tiny_policy_dir, make_snapshot
):
    rows = arithmetic_rows(16, seed=1)
    for row, label in zip(rows, [0.9, 0.7] * 8, strict=True):
        row["soft_label"] = label
    metrics = dpo.train(_config(tiny_policy_dir, max_steps=1), make_snapshot(train=rows), tmp_path)
    assert metrics["loss_type"] == "robust"
    assert metrics["label_smoothing"] == pytest.approx(0.2)
    loss_event = next(r for r in read_metrics(tmp_path) if r.get("event") == "loss")
    assert loss_event["label_smoothing"] == pytest.approx(0.2)


def test_explicit_label_smoothing_and_loss_type_win_over_the_data(tiny_policy_dir, make_snapshot):
    rows = arithmetic_rows(4, with_extras=True)
    train = load_preferences(make_snapshot(train=rows)).train
    config = _config(tiny_policy_dir, label_smoothing=0.0, loss_type="ipo")
    assert dpo.resolve_loss(config, train) == ("ipo", 0.0)


def test_resume_continues_from_the_last_checkpoint(tmp_path, tiny_policy_dir, make_snapshot):
    snapshot = make_snapshot(train=arithmetic_rows(48, seed=1))
    out = tmp_path / "run"
    dpo.train(_config(tiny_policy_dir, max_steps=3, logging_steps=1), snapshot, out)
    metrics = dpo.train(
        _config(tiny_policy_dir, max_steps=5, logging_steps=1, resume=True), snapshot, out
    )
    records = read_metrics(out)
    resumed_at = next(i for i, r in enumerate(records) if r.get("event") == "resume")
    assert records[resumed_at]["checkpoint"].endswith("checkpoint-3")
    assert [r["step"] for r in records[resumed_at:] if "loss" in r] == [4, 5]
    assert metrics["global_step"] == 5


def test_lora_dpo_trains_adapters_and_saves_a_merged_model(
    tmp_path, tiny_policy_dir, make_snapshot
):
    snapshot = make_snapshot(train=arithmetic_rows(16, seed=1))
    out = tmp_path / "lora"
    config = _config(tiny_policy_dir, max_steps=2, use_lora=True, lora_r=4)
    config.lora_target_modules = ["c_attn", "c_proj"]
    dpo.train(config, snapshot, out)
    assert (out / "adapter" / "adapter_config.json").exists()
    assert weights_changed(tiny_policy_dir, out / "final")


def test_pairs_of_similar_length_are_batched_together():
    # 48 tokenized pairs of lengths spread tenfold, in a random order.
    import random
    from types import SimpleNamespace

    import datasets
    from trl import DPOTrainer

    rng = random.Random(0)
    sizes = [rng.randint(5, 300) for _ in range(48)]
    rows = {
        "prompt_ids": [[1] * n for n in sizes],
        "chosen_ids": [[2] * (n % 7 + 1) for n in sizes],
        "rejected_ids": [[3] * (n % 5 + 1) for n in sizes],
    }
    dataset = datasets.Dataset.from_dict(rows)
    lengths = [len(p) + max(len(c), len(r)) for p, c, r in zip(*rows.values(), strict=True)]
    fake = SimpleNamespace(
        train_dataset=dataset,
        args=SimpleNamespace(train_batch_size=4, gradient_accumulation_steps=1),
    )
    trainer_class = dpo._length_grouped(DPOTrainer)
    order = list(trainer_class._get_train_sampler(fake))

    assert sorted(order) == list(range(48))

    def padding(indices):
        batches = [indices[i : i + 4] for i in range(0, len(indices), 4)]
        return sum(
            max(lengths[j] for j in b) * len(b) - sum(lengths[j] for j in b) for b in batches
        )

    # Far less padding than batches in the random order the default sampler would give.
    assert padding(order) < 0.5 * padding(list(range(48)))
