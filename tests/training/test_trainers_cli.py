"""Tests of the training CLI (python -m training.trainers.cli)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import arithmetic_rows
from training.trainers.cli import RECIPES, get_recipe, main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def snapshot(make_snapshot):
    return make_snapshot(train=arithmetic_rows(16), validation=arithmetic_rows(8, seed=1))


def _write(path, values):
    path.write_text(json.dumps(values))
    return path


def test_a_good_config_trains_and_prints_the_final_metrics(
    tmp_path, tiny_reward_dir, snapshot, capsys
):
    config = _write(
        tmp_path / "cfg.json",
        {"model_name_or_path": str(tiny_reward_dir), "max_steps": 2, "learning_rate": 1e-3},
    )
    code = main(
        [
            "--recipe",
            "reward",
            "--config",
            str(config),
            "--data",
            str(snapshot),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["global_step"] == 2
    assert (tmp_path / "out" / "final" / "config.json").exists()


def test_yaml_config_and_resume_flag(tmp_path, tiny_reward_dir, snapshot, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text(f"model_name_or_path: {tiny_reward_dir}\nmax_steps: 2\nsave_steps: 1\n")
    out = tmp_path / "out"
    base = [
        "--recipe",
        "reward",
        "--config",
        str(config),
        "--data",
        str(snapshot),
        "--out",
        str(out),
    ]
    assert main(base) == 0
    config.write_text(f"model_name_or_path: {tiny_reward_dir}\nmax_steps: 3\nsave_steps: 1\n")
    assert main([*base, "--resume"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resume = [r for r in records if r.get("event") == "resume"]
    assert resume and resume[0]["checkpoint"].endswith("checkpoint-2")


@pytest.mark.parametrize(
    ("recipe", "values", "message"),
    [
        ("reward", {"lerning_rate": 1e-3}, "unknown config field(s) for Config: lerning_rate"),
        ("reward", {"model_name_or_path": "/nowhere/model"}, "no such local folder"),
        ("reward", {"overlong": "squash"}, "overlong must be one of"),
        ("reward", {"max_steps": 0}, "max_steps"),
        ("dpo", {"beta": -1.0}, "beta must be positive"),
        ("grpo", {}, "exactly one of reward_model_path and reward_function"),
        ("sft", {"trl_args": {"no_such_arg": 1}}, "no_such_arg"),
        ("sft", {"learning_rate": "fast"}, "wrong type for Config field(s): learning_rate='fast'"),
        ("sft", {"max_steps": 2.5}, "max_steps=2.5"),
        ("rloo", {"use_lora": "yes", "reward_function": "math:sqrt"}, "use_lora='yes'"),
        ("nope", {}, "unknown recipe 'nope'"),
    ],
)
def test_bad_configs_exit_with_code_2_and_a_clear_message(
    tmp_path, tiny_policy_dir, snapshot, capsys, recipe, values, message
):
    values = {"model_name_or_path": str(tiny_policy_dir), "max_steps": 1, **values}
    config = _write(tmp_path / "cfg.json", values)
    code = main(
        [
            "--recipe",
            recipe,
            "--config",
            str(config),
            "--data",
            str(snapshot),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config_text", "message"),
    [("{not json", "cannot parse config"), ("[1, 2]", "must be a mapping")],
)
def test_unreadable_config_files_exit_with_code_2(tmp_path, snapshot, capsys, config_text, message):
    config = tmp_path / "cfg.json"
    config.write_text(config_text)
    code = main(
        [
            "--recipe",
            "sft",
            "--config",
            str(config),
            "--data",
            str(snapshot),
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_bad_data_exits_with_code_2(tmp_path, tiny_policy_dir, capsys):
    config = _write(
        tmp_path / "cfg.json", {"model_name_or_path": str(tiny_policy_dir), "max_steps": 1}
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "only prompts"}\n')
    args = ["--recipe", "dpo", "--config", str(config), "--out", str(tmp_path / "out")]
    assert main([*args, "--data", str(tmp_path / "missing")]) == 2
    assert "dataset folder not found" in capsys.readouterr().err
    assert main([*args, "--data", str(tmp_path / "data")]) == 2
    assert "expected preference rows" in capsys.readouterr().err


def test_describe_lists_fields_with_help(capsys):
    assert main(["--recipe", "dpo", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "beta = 0.1" in out and "Rafailov" in out


def test_registry_covers_every_recipe_name():
    assert set(RECIPES) == {"sft", "reward", "dpo", "grpo", "rloo", "ppo"}
    for name in ("sft", "reward", "dpo", "grpo", "rloo"):
        config_cls, train = get_recipe(name)
        assert callable(train) and hasattr(config_cls, "__dataclass_fields__")


def test_module_entry_point_exits_2_on_a_bad_config(tmp_path, snapshot):
    config = _write(tmp_path / "cfg.json", {"model_name_or_path": "x", "bogus": 1})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.trainers.cli",
            "--recipe",
            "reward",
            "--config",
            str(config),
            "--data",
            str(snapshot),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "bogus" in result.stderr


def test_a_run_that_fails_is_marked_failed_in_progress_json(
    tmp_path, tiny_reward_dir, make_snapshot, capsys
):
    # Every pair compares an answer with itself: nothing is left to train on.
    snapshot = make_snapshot(train=[{"prompt": "p", "chosen": " a", "rejected": " a"}] * 4)
    config = _write(
        tmp_path / "cfg.json", {"model_name_or_path": str(tiny_reward_dir), "max_steps": 1}
    )
    out = tmp_path / "out"
    args = ["--recipe", "reward", "--config", str(config), "--data", str(snapshot)]
    assert main([*args, "--out", str(out)]) == 2
    assert "no training pair is left" in capsys.readouterr().err
    assert json.loads((out / "progress.json").read_text())["status"] == "failed"
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "failed"
