"""Execute a training run: claim the row, launch the CLI, stream its files, record the end.

The supervisor polls the files the CLI writes (``progress.json``, ``metrics.jsonl``, its
stdout/stderr log) into the row about once a second.

Idempotency: every execution claims the row under ``select_for_update`` and bumps
``attempts``; all later writes are fenced on that attempt number, so a supervisor whose run
was taken over (or cancelled) stops instead of writing over the new owner.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from training import alarms as run_alarms_rules
from training import config_policy, processes
from training.config_policy import InvalidTrainingConfig
from training.models import TrainingRun
from training.run_files import (
    CONFIG_FILE,
    LOG_FILE,
    RunFiles,
    incomplete_checkpoints_delete,
    read_json,
)
from training.services import (
    TERMINAL_STATUSES,
    model_version_register,
    numbers_only,
    training_output_root,
    training_run_data_dir,
)
from training.trainers.checkpoints import newest_complete_checkpoint

logger = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2


@dataclass
class Progress:
    """What an ``on_progress`` callback receives about once a second."""

    run_id: int
    step: int
    max_steps: int
    fraction: float
    metrics: dict[str, Any]
    status: str


@dataclass
class Claim:
    """A run this supervisor took, with the attempt number that fences its writes."""

    run: TrainingRun
    attempt: int
    resume_from: str | None
    dropped_checkpoints: list[str] = field(default_factory=list)


def _claim(run_id: int, task_id: str, reason: str = "") -> Claim | None:
    """Mark the run as ours under a row lock, or return None when there is nothing to do."""
    with transaction.atomic():
        run = (
            TrainingRun.objects.select_for_update(of=("self",))
            .select_related("dataset_version", "base_model")
            .filter(pk=run_id)
            .first()
        )
        if run is None:
            logger.warning("training run %s does not exist", run_id)
            return None
        if run.status in TERMINAL_STATUSES:
            logger.info("training run %s is already %s", run_id, run.status)
            return None
        if run.status == TrainingRun.Status.RUNNING and not processes.training_run_worker_gone(
            run=run
        ):
            logger.info(
                "training run %s is running on %s pid %s", run_id, run.worker_host, run.worker_pid
            )
            return None
        if run.status == TrainingRun.Status.RUNNING:
            processes.orphan_kill(run)
        now = timezone.now()
        dropped = incomplete_checkpoints_delete(run.output_dir) if run.output_dir else []
        checkpoint = newest_complete_checkpoint(run.output_dir) if run.output_dir else None
        run.attempts += 1
        if checkpoint is not None:
            run.resumes = [
                *run.resumes,
                {
                    "attempt": run.attempts,
                    "checkpoint": checkpoint[0],
                    "step": checkpoint[1],
                    "at": now.isoformat(),
                    **({"reason": reason} if reason else {}),
                },
            ]
        run.status = TrainingRun.Status.RUNNING
        run.worker_host = processes.this_host()
        run.worker_pid = os.getpid()
        run.child_pid = None
        run.exit_code = None
        run.celery_task_id = task_id or run.celery_task_id
        run.started_at = run.started_at or now
        run.finished_at = None
        run.heartbeat_at = now
        run.error = ""
        if not run.output_dir:
            run.output_dir = str(training_output_root() / f"run-{run.pk}")
        run.save()
    return Claim(
        run=run,
        attempt=run.attempts,
        resume_from=checkpoint[0] if checkpoint else None,
        dropped_checkpoints=dropped,
    )


# --------------------------------------------------------------------------- execute


class _LaunchFailed(Exception):
    """The training process could not be started; the message says why."""


def training_run_execute(
    *,
    run_id: int,
    task_id: str = "",
    on_progress: Callable[[Progress], None] | None = None,
    restart_reason: str = "",
) -> TrainingRun | None:
    """Run the training CLI for a run to its end and record the outcome on the row.

    Safe to call any number of times for the same run: a finished, cancelled or failed run
    is left alone, a run supervised elsewhere (fresh heartbeat) is left alone, and a run
    whose supervisor died resumes from its newest checkpoint. When one process of a
    multi-process run is killed by a signal, the whole run restarts from its newest
    checkpoint (see ``_rank_restart``).
    """
    claim = _claim(run_id, task_id, restart_reason)
    if claim is None:
        return TrainingRun.objects.filter(pk=run_id).first()
    run = claim.run
    output_dir = Path(run.output_dir)
    try:
        processes.output_dir_prepare(output_dir)
    except processes.ArtifactError as exc:
        return _record_failure(run.pk, claim.attempt, str(exc), exit_code=None, tail="")

    files = RunFiles(output_dir=output_dir, log_lines=int(settings.TRAINING_LOG_TAIL_LINES))
    watch = AlarmWatch.for_run(run, claim.attempt)
    run_json = read_json(output_dir / "run.json") or {}
    if run_json.get("status") == "finished" and (output_dir / "final").is_dir():
        # The process finished but its supervisor died before recording it: just record.
        files.poll()
        watch.check(files, force=True)
        return _record_exit(run.pk, claim.attempt, 0, files)
    try:
        process = _launch(claim, files)
    except _LaunchFailed as exc:
        return _record_failure(run.pk, claim.attempt, str(exc), exit_code=None, tail="")
    try:
        TrainingRun.objects.filter(pk=run.pk, attempts=claim.attempt).update(child_pid=process.pid)
        exit_code = _supervise(run.pk, claim.attempt, process, files, on_progress, watch)
    finally:
        if process.poll() is None:
            processes.terminate(process)
        # leftovers such as dataloader workers
        processes.signal_group(process.pid, signal.SIGKILL)
    if exit_code is None:  # taken over, put back in the queue, or stopped by an alarm
        return TrainingRun.objects.filter(pk=run.pk).first()
    files.poll()
    watch.check(files, force=True)
    reason = _rank_restart(run.pk, exit_code, files)
    if reason:
        return training_run_execute(
            run_id=run_id, task_id=task_id, on_progress=on_progress, restart_reason=reason
        )
    return _record_exit(run.pk, claim.attempt, exit_code, files)


def _rank_restart(run_id: int, exit_code: int, files: RunFiles) -> str:
    """Return why the whole run restarts when one of its processes was killed by a signal.

    The launcher (torchrun) has already stopped the other processes. The run restarts from
    its newest complete checkpoint, once per checkpoint: a loss before the first checkpoint,
    or a second one before a newer checkpoint exists (an out-of-memory kill that comes
    back), fails the run as before.
    """
    if exit_code == 0:
        return ""
    reason = processes.rank_killed(files.attempt_tail(80))
    run = TrainingRun.objects.filter(pk=run_id).only("status", "resumes").first()
    if not reason or run is None or run.status != TrainingRun.Status.RUNNING:
        return ""
    found = newest_complete_checkpoint(files.output_dir)
    if found is None or any(
        r.get("reason") and r.get("step") == found[1] for r in run.resumes or []
    ):
        return ""
    with files.log_path.open("a") as log:
        log.write(f"=== {reason}; restarting the whole run from checkpoint step {found[1]}\n")
    return reason


def _launch(claim: Claim, files: RunFiles) -> subprocess.Popen:
    """Write the CLI's config and start the CLI, appending to the run's log."""
    run, output_dir = claim.run, files.output_dir
    try:
        cli_config = config_policy.training_config_for_cli(config=run.config)
        accelerate_name = run.config.get("accelerate_config")
        accelerate_config = (
            config_policy.accelerate_config_path(name=accelerate_name) if accelerate_name else None
        )
    except InvalidTrainingConfig as exc:  # the deployment unregistered its reward function
        raise _LaunchFailed(exc.message) from exc
    try:
        config_path = output_dir / CONFIG_FILE
        config_path.write_text(json.dumps(cli_config, indent=2, sort_keys=True) + "\n")
        command = processes.training_command(
            recipe=run.recipe,
            config_path=config_path,
            data_dir=training_run_data_dir(run=run),
            output_dir=str(output_dir),
            resume=claim.resume_from is not None,
            accelerate_config=accelerate_config,
        )
        log = (output_dir / LOG_FILE).open("ab")
    except OSError as exc:
        reason = "Disk full" if exc.errno == errno.ENOSPC else "The artefact folder is not writable"
        raise _LaunchFailed(f"{reason}: {exc}") from exc
    except processes.ImproperlyConfiguredLauncher as exc:
        raise _LaunchFailed(f"Unknown launcher: {exc}") from exc
    with log:
        files.log_start = log.tell()
        header = f"=== attempt {claim.attempt} on {processes.this_host()}: {' '.join(command)}\n"
        if claim.dropped_checkpoints:
            dropped = ", ".join(claim.dropped_checkpoints)
            header += f"=== deleted half-written checkpoints: {dropped}\n"
        if claim.resume_from:
            header += f"=== resuming from {claim.resume_from}\n"
        log.write(header.encode())
        log.flush()
        try:
            return processes.process_start(
                command=command, log=log, accelerate_config=accelerate_config
            )
        except OSError as exc:
            raise _LaunchFailed(
                f"Could not start the training process ({command[0]}): {exc}"
            ) from exc


def _supervise(
    run_id: int,
    attempt: int,
    process: subprocess.Popen,
    files: RunFiles,
    on_progress: Callable[[Progress], None] | None,
    watch: AlarmWatch,
) -> int | None:
    """Stream progress into the row until the process exits; return its exit code.

    Return None when the row says another supervisor owns the run, or when an alarm its
    config stops on fired (the process is killed and the stop recorded). A cancelled run has
    its process group terminated and its exit code returned.
    """
    poll = float(settings.TRAINING_POLL_SECONDS)
    max_runtime = float(settings.TRAINING_MAX_RUNTIME_SECONDS or 0)
    started = time.monotonic()
    while True:
        try:
            exit_code = process.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            exit_code = None
        files.poll()
        state = _heartbeat(run_id, attempt, files)
        if on_progress is not None:
            on_progress(
                Progress(
                    run_id=run_id,
                    step=int(files.progress.get("step") or 0),
                    max_steps=int(files.progress.get("max_steps") or 0),
                    fraction=files.fraction(),
                    metrics=files.metrics(),
                    status=state,
                )
            )
        if exit_code is not None:
            return exit_code
        stop = watch.check(files) if state == TrainingRun.Status.RUNNING else None
        if stop is not None:
            with files.log_path.open("a") as log:
                log.write(f"=== stopping: alarm {stop['kind']} at step {stop['step']}\n")
            processes.terminate(process)
            _record_alarm_stop(run_id, attempt, stop, files)
            return None
        if state == TrainingRun.Status.CANCELLED:
            processes.terminate(process)
            return process.returncode
        if state == "lost":
            logger.warning("training run %s was taken over; stopping attempt %s", run_id, attempt)
            processes.terminate(process)
            return None
        if max_runtime and time.monotonic() - started > max_runtime:
            with files.log_path.open("a") as log:
                log.write(f"=== stopping: over TRAINING_MAX_RUNTIME_SECONDS={max_runtime:.0f}\n")
            processes.terminate(process)
            return process.returncode


@dataclass
class AlarmWatch:
    """Computes a run's alarms as its metrics arrive; stores each kind once on the row."""

    run_id: int
    attempt: int
    recipe: str
    stop_kinds: frozenset[str]
    stored: list[dict[str, Any]]
    every: float
    last_check: float = float("-inf")
    records_checked: int = -1

    @classmethod
    def for_run(cls, run: TrainingRun, attempt: int) -> AlarmWatch:
        return cls(
            run_id=run.pk,
            attempt=attempt,
            recipe=run.recipe,
            stop_kinds=run_alarms_rules.stop_kinds(run.recipe, run.config or {}),
            stored=list(run.alarms or []),
            every=float(settings.TRAINING_ALARM_CHECK_SECONDS),
        )

    def check(self, files: RunFiles, *, force: bool = False) -> dict[str, Any] | None:
        """Check the alarms now if due; return the first new alarm that stops the run."""
        now = time.monotonic()
        if not force and now - self.last_check < self.every:
            return None
        if len(files.records) == self.records_checked and not force:
            return None
        self.last_check, self.records_checked = now, len(files.records)
        known = {a["kind"] for a in self.stored}
        fired = run_alarms_rules.run_alarms(self.recipe, files.records)
        new = [a for a in fired if a.kind not in known]
        stop = next((a for a in new if a.kind in self.stop_kinds), None)
        for alarm in new:
            action = "stopped" if alarm is stop else "recorded"
            self.stored.append(run_alarms_rules.alarm_record(alarm, action=action))
        try:
            TrainingRun.objects.filter(pk=self.run_id, attempts=self.attempt).update(
                alarms=self.stored, alarms_checked_at=timezone.now()
            )
        except DatabaseError:
            logger.warning("training run %s: storing alarms failed", self.run_id, exc_info=True)
            connection.close()
        if new:
            logger.warning(
                "training run %s: alarm(s) %s", self.run_id, ", ".join(a.kind for a in new)
            )
        return run_alarms_rules.alarm_record(stop, action="stopped") if stop else None


def _record_alarm_stop(run_id: int, attempt: int, alarm: dict[str, Any], files: RunFiles) -> None:
    """Record a run its config stopped on an alarm, keeping its newest complete checkpoint."""
    found = newest_complete_checkpoint(files.output_dir)
    kept = (
        f" Its newest complete checkpoint (step {found[1]}) is kept."
        if found
        else " It had saved no complete checkpoint."
    )
    error = (
        f"Stopped by the alarm {alarm['kind']} at step {alarm['step']}: {alarm['reason']}."
        f"{kept} (The run's config stops on this alarm: stop_on_alarm.)"
    )
    with transaction.atomic():
        run = _locked_attempt(run_id, attempt)
        if run is None or run.status != TrainingRun.Status.RUNNING:
            return
        run.status = TrainingRun.Status.FAILED
        run.error = error
        run.child_pid = None
        run.finished_at = timezone.now()
        run.log_tail = files.log_tail()
        if found:
            run.checkpoint_path = found[0]
        run.save()


def _heartbeat(run_id: int, attempt: int, files: RunFiles) -> str:
    """Write progress into the row if this attempt still owns it; return the row's state."""
    fields = {
        "progress": files.fraction(),
        "current_metrics": files.metrics(),
        "log_tail": files.log_tail(),
        "heartbeat_at": timezone.now(),
    }
    if files.checkpoint:
        fields["checkpoint_path"] = files.checkpoint
    try:
        updated = TrainingRun.objects.filter(
            pk=run_id, attempts=attempt, status=TrainingRun.Status.RUNNING
        ).update(**fields)
        if updated:
            return TrainingRun.Status.RUNNING
        row = TrainingRun.objects.filter(pk=run_id).values("status", "attempts").first()
    except DatabaseError:
        # A database blip must not kill hours of training: keep going, reconnect next time.
        logger.warning("training run %s: heartbeat failed", run_id, exc_info=True)
        connection.close()
        return TrainingRun.Status.RUNNING
    if row is None:
        return "lost"
    if row["status"] == TrainingRun.Status.CANCELLED and row["attempts"] == attempt:
        return TrainingRun.Status.CANCELLED
    return "lost"


# --------------------------------------------------------------------------- outcomes


def _failure_message(exit_code: int, tail: str, output_dir: str) -> str:
    lowered = tail.lower()
    if "no space left on device" in lowered or "disk quota exceeded" in lowered:
        reason = f"Disk full while writing to {output_dir}."
    elif "permission denied" in lowered or "read-only file system" in lowered:
        reason = f"The artefact folder {output_dir} (or a file the run needs) is not writable."
    elif exit_code == EXIT_BAD_INPUT:
        reason = "Bad config or data (the training CLI exited with code 2)."
    elif exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else ""
        reason = f"The training process was killed by signal {name or -exit_code}"
        reason += " (out of memory?)." if name == "SIGKILL" else "."
    else:
        reason = f"Training failed (exit code {exit_code})."
    return f"{reason}\n{tail}".strip()


def _locked_attempt(run_id: int, attempt: int) -> TrainingRun | None:
    run = (
        TrainingRun.objects.select_for_update(of=("self",))
        .select_related("dataset_version", "base_model")
        .filter(pk=run_id)
        .first()
    )
    if run is None or run.attempts != attempt:
        return None
    return run


def _record_failure(
    run_id: int, attempt: int, error: str, *, exit_code: int | None, tail: str
) -> TrainingRun | None:
    with transaction.atomic():
        run = _locked_attempt(run_id, attempt)
        if run is None:
            return TrainingRun.objects.filter(pk=run_id).first()
        if run.status == TrainingRun.Status.RUNNING:
            run.status = TrainingRun.Status.FAILED
            run.error = config_policy.paths_redact(error, keep=run.output_dir)
        run.exit_code = exit_code
        run.child_pid = None
        run.finished_at = run.finished_at or timezone.now()
        if tail:
            run.log_tail = config_policy.paths_redact(tail, keep=run.output_dir)
        run.save()
    return run


def _record_exit(run_id: int, attempt: int, exit_code: int, files: RunFiles) -> TrainingRun | None:
    """Record how the process ended: success (and its model), failure or cancellation."""
    final_dir = files.output_dir / "final"
    if exit_code != 0 or not final_dir.is_dir():
        tail = files.attempt_tail()
        if exit_code == 0:
            error = f"The training CLI exited 0 but wrote no model to {final_dir}.\n{tail}"
        else:
            error = _failure_message(exit_code, tail, str(files.output_dir))
        return _record_failure(run_id, attempt, error, exit_code=exit_code, tail=files.log_tail())
    run_json = read_json(files.output_dir / "run.json") or {}
    final_metrics = run_json.get("final_metrics") or files.final_metrics or {}
    with transaction.atomic():
        run = _locked_attempt(run_id, attempt)
        if run is None:
            return TrainingRun.objects.filter(pk=run_id).first()
        run.exit_code = exit_code
        run.child_pid = None
        run.log_tail = files.log_tail()
        run.finished_at = run.finished_at or timezone.now()
        if run.status == TrainingRun.Status.RUNNING:
            run.status = TrainingRun.Status.SUCCEEDED
            run.progress = 1.0
            run.checkpoint_path = str(final_dir)
            run.current_metrics = {**files.metrics(), **numbers_only(final_metrics)}
            model_version_register(run=run, final_metrics=final_metrics, run_json=run_json)
        run.save()
    return run
