"""scripts/gpu_check.sh on a machine without CUDA: it says so, runs nothing, exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_cuda_it_says_so_and_exits_0(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would train")
    # CUDA_VISIBLE_DEVICES="" hides any device, as on a CPU-only CI runner
    done = _run(CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "no CUDA device" in done.stdout
    assert "tokens/s" not in done.stdout
    assert list(tmp_path.iterdir()) == []  # built no models, wrote nothing


def test_a_model_folder_without_config_is_refused_before_anything_runs(tmp_path):
    done = _run("--model", str(tmp_path))
    assert done.returncode == 2
    assert "config.json" in done.stderr
