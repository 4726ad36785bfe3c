"""Write run.json: what is needed to repeat a run (config, data hash, seeds, versions, commit)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from training.trainers.data import data_hash, read_manifest
from training.trainers.run_log import atomic_write_json, utc_now

LIBRARIES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "tokenizers")


def library_versions() -> dict[str, str | None]:
    """Return the versions of the libraries that shape training results."""
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> dict[str, Any] | None:
    """Return the commit (and whether the tree is dirty) of the checkout holding this code."""
    repo = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def host_info() -> dict[str, Any]:
    """Return the machine facts that explain speed and numerics."""
    import torch

    cuda = []
    if torch.cuda.is_available():
        cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_devices": cuda,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }


def write_run_json(
    output_dir: str | Path,
    config: Any,
    dataset_dir: str | Path | None,
    seeds: dict[str, int],
    **extra: Any,
) -> Path:
    """Write ``output_dir/run.json``: config, data hash, seeds, library versions, git commit, host.

    Called again at the end of a run with ``final_metrics=...``: earlier keys are kept.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "run.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    config_dict = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    data = None
    if dataset_dir is not None:
        dataset_dir = Path(dataset_dir)
        data = {
            "path": str(dataset_dir.resolve()),
            "hash": data_hash(dataset_dir),
            "manifest": read_manifest(dataset_dir),
        }
    record = {
        **previous,
        "config": config_dict,
        "config_class": f"{type(config).__module__}.{type(config).__qualname__}",
        "data": data,
        "seeds": seeds,
        "versions": library_versions(),
        "git": git_commit(),
        "host": host_info(),
        "started_at": previous.get("started_at", utc_now()),
        "updated_at": utc_now(),
        **extra,
    }
    atomic_write_json(path, record)
    return path
