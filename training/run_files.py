"""Read what the training CLI writes into a run's folder.

The CLI writes ``progress.json`` (replaced atomically), appends ``metrics.jsonl`` and its
stdout/stderr log, and saves ``checkpoint-N`` folders; the supervisor reads them about once a
second while the process runs, and again when it resumes a run. Checkpoint discovery is
``training.trainers.checkpoints``, shared with the CLI's ``--resume``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training import config_policy
from training.trainers.checkpoints import checkpoint_complete, checkpoint_folders

CONFIG_FILE = "train_config.json"
LOG_FILE = "train.log"
ERROR_TAIL_LINES = 30
MAX_RECORDS = 20_000


def incomplete_checkpoints_delete(output_dir: str | Path) -> list[str]:
    """Delete half-written checkpoints so that ``--resume`` picks a complete one."""
    dropped = []
    for _step, path in checkpoint_folders(output_dir):
        if not checkpoint_complete(path):
            shutil.rmtree(path, ignore_errors=True)
            dropped.append(path.name)
    return dropped


def tail_lines(path: Path, n: int, *, start: int = 0, max_bytes: int = 64 * 1024) -> list[str]:
    """Return the last ``n`` lines of a text file from byte ``start`` on (empty if missing)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(start, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = [line.rstrip() for line in data.decode("utf-8", "replace").splitlines()]
    return [line for line in lines if line][-n:]


def read_json(path: Path) -> dict[str, Any] | None:
    """Return a JSON object from ``path``, or None when it is missing or half-written."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class RunFiles:
    """Incremental reader of what the CLI writes into its output folder."""

    output_dir: Path
    log_start: int = 0
    metrics_offset: int = 0
    progress: dict[str, Any] = field(default_factory=dict)
    final_metrics: dict[str, Any] | None = None
    checkpoint: str = ""
    log_lines: int = 50
    # The logged metric records (events left out), newest MAX_RECORDS kept, for the alarms.
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.output_dir / LOG_FILE

    def poll(self) -> None:
        """Read progress.json and any new lines of metrics.jsonl."""
        progress = read_json(self.output_dir / "progress.json")
        if progress is not None:
            self.progress = progress
        path = self.output_dir / "metrics.jsonl"
        try:
            with path.open("rb") as fh:
                fh.seek(self.metrics_offset)
                chunk = fh.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written last line waits
        self.metrics_offset += len(complete)
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            event = record.get("event")
            if event is None and "step" in record:
                self.records.append(record)
                if len(self.records) > MAX_RECORDS:
                    del self.records[: len(self.records) - MAX_RECORDS]
            elif event == "checkpoint" and record.get("path"):
                self.checkpoint = str(record["path"])
            elif event == "final":
                self.final_metrics = {
                    k: v for k, v in record.items() if k not in ("event", "time", "step")
                }

    def log_tail(self, n: int | None = None) -> str:
        """Return the log's last lines, with server paths outside the run's folder hidden."""
        text = "\n".join(tail_lines(self.log_path, n or self.log_lines))
        return config_policy.paths_redact(text, keep=self.output_dir)

    def attempt_tail(self, n: int = ERROR_TAIL_LINES) -> str:
        """Return the last lines this attempt's process wrote (server paths hidden)."""
        text = "\n".join(tail_lines(self.log_path, n, start=self.log_start))
        return config_policy.paths_redact(text, keep=self.output_dir)

    def fraction(self) -> float:
        try:
            value = float(self.progress.get("fraction") or 0.0)
        except (TypeError, ValueError):
            value = 0.0
        return min(1.0, max(0.0, value))

    def metrics(self) -> dict[str, Any]:
        metrics = dict(self.progress.get("metrics") or {})
        for key in ("step", "max_steps", "epoch"):
            if self.progress.get(key) is not None:
                metrics[key] = self.progress[key]
        return metrics
