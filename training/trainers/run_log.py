"""Stream a run's progress to files a supervising process reads: metrics.jsonl, progress.json."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write JSON to ``path`` so that readers never see a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def utc_now() -> str:
    """Return the time now in UTC, ISO 8601 to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class RunLogger(TrainerCallback):
    """Stream a run's progress to files a supervising process can read.

    Every log event is appended as one JSON object to ``metrics.jsonl``;
    ``progress.json`` (step, max_steps, fraction, latest metrics) is replaced atomically.
    Use it as a ``TrainerCallback``, or call ``log``/``progress``/``event`` from a custom loop.
    Only the main process writes.
    """

    def __init__(self, output_dir: str | Path, *, echo: bool = True):
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.output_dir / "metrics.jsonl"
        self.progress_path = self.output_dir / "progress.json"
        self.echo = echo
        # Under `accelerate launch` only rank 0 writes; the Trainer confirms it on train begin.
        self.is_main = os.environ.get("RANK", "0") == "0"
        self.step = 0
        self.max_steps = 0
        self.epoch: float | None = None
        self.latest: dict[str, Any] = {}
        self.status = "running"
        self._last_progress_write = 0.0

    # Plain API, usable outside the HF Trainer.
    def info(self, message: str) -> None:
        """Print a human-readable line on stderr."""
        if self.echo and self.is_main:
            print(f"[prefloop] {message}", file=sys.stderr, flush=True)

    def event(self, event: str, /, **data: Any) -> None:
        """Append a non-metric event (resume, dropped rows, final metrics) to metrics.jsonl."""
        self._append({"event": event, "step": self.step, "time": utc_now(), **data})

    def log(self, metrics: dict[str, Any], *, step: int | None = None) -> None:
        """Append metrics at ``step`` and update progress.json."""
        if step is not None:
            self.step = step
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        self.latest.update(clean)
        self._append({"step": self.step, "epoch": self.epoch, "time": utc_now(), **clean})
        self.write_progress(force=True)
        shown = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in list(clean.items())[:8]
        )
        self.info(f"step {self.step}/{self.max_steps}: {shown}")

    def progress(self, step: int, max_steps: int | None = None) -> None:
        """Record that ``step`` of ``max_steps`` is done (progress.json at most twice a second)."""
        self.step = step
        if max_steps is not None:
            self.max_steps = max_steps
        self.write_progress()

    def finish(self, status: str = "finished", **metrics: Any) -> None:
        """Mark the run as ended in progress.json."""
        self.status = status
        self.latest.update({k: _jsonable(v) for k, v in metrics.items()})
        self.write_progress(force=True)

    def write_progress(self, *, force: bool = False) -> None:
        """Replace progress.json with the current state."""
        if not self.is_main:
            return
        now = time.monotonic()
        if not force and now - self._last_progress_write < 0.5:
            return
        self._last_progress_write = now
        fraction = min(1.0, self.step / self.max_steps) if self.max_steps else 0.0
        if self.status == "finished":
            fraction = 1.0
        atomic_write_json(
            self.progress_path,
            {
                "status": self.status,
                "step": self.step,
                "max_steps": self.max_steps,
                "fraction": fraction,
                "epoch": self.epoch,
                "metrics": self.latest,
                "updated_at": utc_now(),
            },
        )

    def _append(self, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    # TrainerCallback hooks.
    def on_train_begin(self, args, state, control, **kwargs):
        self.is_main = state.is_world_process_zero
        self.status = "running"
        self.progress(state.global_step, state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        self.epoch = state.epoch
        self.progress(state.global_step, state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.is_main = state.is_world_process_zero
        self.epoch = state.epoch
        self.max_steps = state.max_steps or self.max_steps
        logs = dict(logs or {})
        prefix = _eval_prefix(logs)
        if prefix:
            logs = {metric_renamed(key, prefix): value for key, value in logs.items()}
        self.log(logs, step=state.global_step)

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.event("checkpoint", path=str(checkpoint))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return str(value)


def metric_renamed(key: str, prefix: str) -> str:
    """Return an ``eval_*`` metric name under ``prefix`` (e.g. ``test_*``)."""
    if prefix != "eval" and key.startswith("eval_"):
        return f"{prefix}_{key[len('eval_') :]}"
    return key


def _eval_prefix(logs: dict[str, Any]) -> str | None:
    for key in logs:
        if key.endswith("_runtime") and not key.startswith(("train", "eval")):
            return key[: -len("_runtime")]
    return None
