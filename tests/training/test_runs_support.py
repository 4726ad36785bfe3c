"""Helpers shared by the training-run and Celery tests (no tests here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from annotation.models import DatasetVersion
from tests.training.conftest import arithmetic_rows


def reward_config(model_dir: Path, **overrides) -> dict:
    """Return a small reward-model config: a few seconds of training on a tiny GPT-2."""
    config = {
        "model_name_or_path": str(model_dir),
        "max_steps": 20,
        "logging_steps": 5,
        "save_steps": 10,
        "max_length": 64,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-3,
    }
    config.update(overrides)
    return config


@pytest.fixture
def training_settings(settings, tmp_path):
    """Write runs under tmp_path and poll fast."""
    settings.TRAINING_OUTPUT_ROOT = str(tmp_path / "runs")
    settings.TRAINING_MIN_FREE_BYTES = 1 << 20
    settings.TRAINING_POLL_SECONDS = 0.2
    settings.TRAINING_KILL_GRACE_SECONDS = 5
    settings.TRAINING_LAUNCHER = "python"
    return settings


@pytest.fixture
def reward_snapshot(make_snapshot) -> Path:
    return make_snapshot(
        train=arithmetic_rows(64), validation=arithmetic_rows(16, seed=1), manifest={"n": 80}
    )


def make_dataset_version(project, path: Path, version: int = 1) -> DatasetVersion:
    return DatasetVersion.objects.create(
        project=project, version=version, path=str(path), status="ready", content_hash="f" * 64
    )


def wait_for(predicate, *, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
