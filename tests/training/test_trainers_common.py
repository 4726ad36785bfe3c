"""Tests of training.trainers.common: configs, run logging and run.json."""

import json
from dataclasses import dataclass, field

import pytest

from training.trainers.common import (
    BaseRecipeConfig,
    ConfigError,
    config_from_dict,
    resume_checkpoint,
)
from training.trainers.provenance import write_run_json
from training.trainers.run_log import RunLogger


def test_every_config_field_has_help():
    from dataclasses import fields

    from training.trainers import dpo, online, reward, sft

    for cls in (
        reward.Config,
        dpo.Config,
        sft.Config,
        online.GRPORecipeConfig,
        online.RLOORecipeConfig,
    ):
        missing = [f.name for f in fields(cls) if not f.metadata.get("help")]
        assert not missing, f"{cls.__module__}.{cls.__name__}: {missing}"


def test_unknown_config_fields_are_rejected_by_name(tiny_policy_dir):
    with pytest.raises(ConfigError, match="lerning_rate"):
        config_from_dict(
            BaseRecipeConfig, {"model_name_or_path": str(tiny_policy_dir), "lerning_rate": 1}
        )


def test_a_missing_model_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such local folder"):
        config_from_dict(BaseRecipeConfig, {"model_name_or_path": str(tmp_path / "none")})


def test_run_logger_appends_events_and_replaces_progress(tmp_path):
    logger = RunLogger(tmp_path, echo=False)
    logger.progress(0, 10)
    logger.log({"loss": 1.5}, step=2)
    logger.event("checkpoint", path="x")
    logger.log({"loss": 1.0, "eval_accuracy": 0.75}, step=5)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("loss") for r in records] == [1.5, None, 1.0]
    assert records[1]["event"] == "checkpoint"
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 5 and progress["max_steps"] == 10
    assert progress["fraction"] == pytest.approx(0.5)
    assert progress["metrics"] == {"loss": 1.0, "eval_accuracy": 0.75}
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temp file + os.replace
    logger.finish()
    assert json.loads((tmp_path / "progress.json").read_text())["fraction"] == 1.0


def test_run_logger_names_test_metrics_after_their_split(tmp_path):
    class State:
        is_world_process_zero = True
        epoch = 1.0
        max_steps = 4
        global_step = 4

    logger = RunLogger(tmp_path, echo=False)
    logger.on_log(
        None, State(), None, logs={"test_loss": 0.1, "test_runtime": 1, "eval_accuracy": 1.0}
    )
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["test_accuracy"] == 1.0 and "eval_accuracy" not in record


@dataclass
class _Config:
    alpha: float = field(default=0.5, metadata={"help": "a"})


def test_run_json_records_config_data_seeds_versions_and_host(tmp_path, make_snapshot):
    from tests.training.conftest import arithmetic_rows
    from training.trainers.data import data_hash

    snapshot = make_snapshot(train=arithmetic_rows(2), manifest={"rows": 2})
    write_run_json(tmp_path, _Config(), snapshot, {"seed": 3}, recipe="x")
    write_run_json(tmp_path, _Config(), snapshot, {"seed": 3}, final_metrics={"loss": 1})
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["config"] == {"alpha": 0.5}
    assert run["data"]["hash"] == data_hash(snapshot)
    assert run["data"]["manifest"]["rows"] == 2
    assert run["seeds"] == {"seed": 3}
    assert {"torch", "transformers", "trl", "peft", "datasets", "accelerate"} <= set(
        run["versions"]
    )
    assert run["host"]["hostname"]
    assert run["recipe"] == "x" and run["final_metrics"] == {"loss": 1}  # earlier keys kept


def test_resume_skips_a_checkpoint_whose_save_was_cut_short(tmp_path):
    # Given a complete checkpoint-2 and a checkpoint-4 whose save was killed before its
    # trainer_state.json was written (transformers writes it last)
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "model.safetensors").write_bytes(b"half")
    logger = RunLogger(tmp_path, echo=False)

    # When the CLI is asked to resume
    checkpoint = resume_checkpoint(tmp_path, True, logger)

    # Then it resumes from the complete one, and says so in metrics.jsonl
    assert checkpoint == str(tmp_path / "checkpoint-2")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "resume" and records[-1]["checkpoint"] == checkpoint
