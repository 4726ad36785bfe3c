"""Tests of the GRPO and RLOO recipes (training.trainers.online)."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.training.conftest import (
    arithmetic_rows,
    assert_run_json_complete,
    read_metrics,
    weights_changed,
)
from training.trainers import online, reward
from training.trainers.common import ConfigError


def digit_share(prompts, completions, **kwargs):
    """Reward the share of digits in a completion (a Python reward function for tests)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / (1 + len(t)) for t in texts]


def _values(model_dir, **overrides):
    values = {
        "model_name_or_path": str(model_dir),
        "max_steps": 4,
        "learning_rate": 1e-3,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "max_completion_length": 12,
        "logging_steps": 1,
        "save_steps": 2,
    }
    return {**values, **overrides}


@pytest.mark.parametrize("conversational", [False, True])
def test_grpo_with_a_python_reward_function(
    tmp_path, tiny_policy_dir, make_snapshot, conversational
):
    snapshot = make_snapshot(
        train=arithmetic_rows(16, seed=1, conversational=conversational),
        validation=arithmetic_rows(4, seed=2, conversational=conversational),
    )
    out = tmp_path / "grpo"
    config = online.GRPORecipeConfig(
        **_values(tiny_policy_dir, reward_function=f"{__name__}:digit_share")
    )
    metrics = online.train_grpo(config, snapshot, out, None)

    assert metrics["global_step"] == 4
    assert "eval_reward" in metrics
    rewards = [
        r["rewards/digit_share/mean"] for r in read_metrics(out) if "rewards/digit_share/mean" in r
    ]
    assert len(rewards) == 4
    assert weights_changed(tiny_policy_dir, out / "final")
    assert (out / "checkpoint-4").is_dir()
    assert_run_json_complete(out, "grpo")

    model = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    tokenizer = AutoTokenizer.from_pretrained(str(out / "final"))
    assert tokenizer.padding_side == "right"
    ids = tokenizer("Q: What is 2 + 2?\nA:", return_tensors="pt")
    generated = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]


def test_rloo_with_a_trained_reward_model(
    tmp_path, tiny_policy_dir, tiny_reward_dir, make_snapshot
):
    snapshot = make_snapshot(train=arithmetic_rows(32, seed=1))
    reward.train(
        reward.Config(model_name_or_path=str(tiny_reward_dir), max_steps=4, learning_rate=1e-3),
        snapshot,
        tmp_path / "rm",
    )
    out = tmp_path / "rloo"
    config = online.RLOORecipeConfig(
        **_values(tiny_policy_dir, reward_model_path=str(tmp_path / "rm" / "final"))
    )
    metrics = online.train_rloo(config, snapshot, out, None)

    assert metrics["global_step"] == 4
    assert any(key.startswith("rewards/reward_model") for r in read_metrics(out) for key in r)
    assert weights_changed(tiny_policy_dir, out / "final")
    assert_run_json_complete(out, "rloo")


def test_grpo_with_trl_reward_model_scoring(
    tmp_path, tiny_policy_dir, tiny_reward_dir, make_snapshot
):
    snapshot = make_snapshot(train=arithmetic_rows(8, seed=1, conversational=True))
    config = online.GRPORecipeConfig(
        **_values(
            tiny_policy_dir,
            max_steps=1,
            reward_model_path=str(tiny_reward_dir),
            reward_model_scoring="trl",
        )
    )
    assert online.train_grpo(config, snapshot, tmp_path)["global_step"] == 1


def test_resume_continues_from_the_last_checkpoint(tmp_path, tiny_policy_dir, make_snapshot):
    snapshot = make_snapshot(train=arithmetic_rows(16, seed=1))
    values = _values(tiny_policy_dir, reward_function=f"{__name__}:digit_share", max_steps=2)
    out = tmp_path / "run"
    online.train_rloo(online.RLOORecipeConfig(**values), snapshot, out)
    values.update(max_steps=3, resume=True)
    metrics = online.train_rloo(online.RLOORecipeConfig(**values), snapshot, out)
    records = read_metrics(out)
    resumed_at = next(i for i, r in enumerate(records) if r.get("event") == "resume")
    assert [r["step"] for r in records[resumed_at:] if "loss" in r] == [3]
    assert metrics["global_step"] == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "exactly one of"),
        ({"reward_function": "no_such_module:f"}, "cannot import"),
        ({"reward_function": "math"}, "module:function"),
        ({"reward_function": "math:nothing"}, "no callable"),
        ({"reward_function": "math:sqrt", "num_generations": 3}, "multiple of num_generations"),
    ],
)
def test_bad_reward_settings_are_config_errors(tiny_policy_dir, overrides, message):
    config = online.GRPORecipeConfig(**_values(tiny_policy_dir, **overrides))
    with pytest.raises(ConfigError, match=message):
        config.validate()


def test_overlong_prompts_are_dropped_and_counted(tmp_path, tiny_policy_dir, make_snapshot):
    rows = arithmetic_rows(8, seed=1)
    rows[0]["prompt"] = "Please think hard. " * 30 + rows[0]["prompt"]
    config = online.GRPORecipeConfig(
        **_values(
            tiny_policy_dir,
            max_steps=1,
            max_length=40,
            reward_function=f"{__name__}:digit_share",
        )
    )
    metrics = online.train_grpo(config, make_snapshot(train=rows), tmp_path)
    assert metrics["train_dropped_overlong"] == 1
