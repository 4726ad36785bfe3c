"""Training runs: create, execute (under Celery or in-process), cancel, resume, register models.

A run is executed by a supervisor: the training CLI (``python -m training.trainers.cli``, or
under ``accelerate launch``) runs in its own process group, and the supervisor polls the
files the CLI writes (``progress.json``, ``metrics.jsonl``, its stdout/stderr log) into the
row about once a second. The supervisor never imports torch, so a worker keeps no GPU memory
after a run, and cancelling kills the whole process group.

Idempotency: every execution claims the row under ``select_for_update`` and bumps
``attempts``; all later writes are fenced on that attempt number, so a supervisor whose run
was taken over (or cancelled) stops instead of writing over the new owner.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from annotation.services import Conflict, NotFound
from training import config_policy
from training.config_policy import InvalidTrainingConfig
from training.models import ModelVersion, Recipe, TrainingRun

logger = logging.getLogger(__name__)

CLI_MODULE = "training.trainers.cli"
EXIT_BAD_INPUT = 2
CONFIG_FILE = "train_config.json"
LOG_FILE = "train.log"
ERROR_TAIL_LINES = 30
TERMINAL_STATUSES = (
    TrainingRun.Status.SUCCEEDED,
    TrainingRun.Status.FAILED,
    TrainingRun.Status.CANCELLED,
)
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# The training process's environment is built from these (see _child_env).
CHILD_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",  # CUDA and NCCL libraries on GPU hosts
        "XDG_CACHE_HOME",
        "TOKENIZERS_PARALLELISM",
        "DISABLE_MLFLOW_INTEGRATION",
        # torch.distributed / accelerate rendezvous
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
    }
)
CHILD_ENV_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "TRITON_",
    "HF_",
    "TRANSFORMERS_",
    "ACCELERATE_",
    "TORCH_",
    "PYTORCH_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
)
# A credential under an allowed prefix (HF_TOKEN, ...) is never passed on.
CHILD_ENV_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|KEY|AUTH", re.IGNORECASE)
_PR_SET_PDEATHSIG = 1


class ArtifactError(Exception):
    """The artefact folder cannot take the run's output (unwritable, or the disk is full)."""


class ImproperlyConfiguredLauncher(ValueError):
    """TRAINING_LAUNCHER names no known launcher."""


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def training_output_root() -> Path:
    """Return the folder under which every run gets ``run-<id>/``."""
    root = _setting("TRAINING_OUTPUT_ROOT", None)
    return Path(root) if root else Path(settings.ARTIFACT_ROOT) / "training"


# --------------------------------------------------------------------------- create


def training_config_validate(*, recipe: str, config: dict[str, Any]) -> None:
    """Raise InvalidTrainingConfig unless the library accepts ``config`` for ``recipe``.

    Skipped when the training library cannot be imported here (a web host without torch):
    the CLI validates again and exits 2 on a bad config.
    """
    if recipe not in Recipe.values:
        raise InvalidTrainingConfig(
            f"Unknown recipe {recipe!r}; choose from {', '.join(Recipe.values)}."
        )
    if not isinstance(config, dict):
        raise InvalidTrainingConfig("config must be a JSON object of field names to values.")
    if "resume" in config:
        raise InvalidTrainingConfig("'resume' is set by the runner, not by the config.")
    try:
        from training.trainers import cli
        from training.trainers.common import ConfigError
        from training.trainers.data import DatasetError
    except ImportError:  # pragma: no cover - depends on the host
        logger.warning("training library unavailable: config of %s not validated", recipe)
        return
    try:
        config_cls, _train = cli.get_recipe(recipe)
        cli.build_config(config_cls, config, resume=False)
    except (cli.UsageError, ConfigError, DatasetError, TypeError, ValueError) as exc:
        raise InvalidTrainingConfig(f"Bad {recipe} config: {exc}") from exc
    except RuntimeError as exc:  # the recipe's module is missing
        raise InvalidTrainingConfig(str(exc)) from exc


def training_run_create(
    *,
    recipe: str,
    config: dict[str, Any],
    dataset_version=None,
    dataset_path: str | Path | None = None,
    base_model: ModelVersion | None = None,
    base_model_path: str = "",
    project=None,
    user=None,
    enqueue: bool = True,
) -> TrainingRun:
    """Validate and create a queued run; queue its Celery task once the transaction commits.

    ``user`` is the caller whose rights the config is checked against (see
    ``training.config_policy``); None is the server itself (loop, management commands).
    """
    if recipe not in Recipe.values:
        raise InvalidTrainingConfig(
            f"recipe: unknown recipe {recipe!r}; choose from {', '.join(Recipe.values)}.",
            field="recipe",
        )
    if (dataset_version is None) == (not dataset_path):
        raise InvalidTrainingConfig("Give exactly one of a dataset version or a dataset path.")
    if dataset_version is not None:
        if dataset_version.status != "ready" or not dataset_version.path:
            raise Conflict(
                f"Dataset version {dataset_version.pk} is {dataset_version.status}, not ready."
            )
        if project is not None and project.pk != dataset_version.project_id:
            raise InvalidTrainingConfig(
                "dataset_version_id: the dataset version belongs to another project.",
                field="dataset_version_id",
            )
        project = project or dataset_version.project
        data_dir = config_policy.path_check(value=dataset_version.path, field="dataset_version_id")
    else:
        data_dir = config_policy.path_check(value=str(dataset_path), field="dataset_path")
    if not Path(data_dir).is_dir():
        field = "dataset_version_id" if dataset_version is not None else "dataset_path"
        raise InvalidTrainingConfig(f"{field}: the dataset folder is missing.", field=field)

    config = config_policy.training_config_resolve(
        recipe=recipe, config=config or {}, user=user, project=project
    )
    if base_model_path:
        base_model_path = config_policy.path_check(value=base_model_path, field="base_model_path")
    model_path = (
        config.get("model_name_or_path")
        or base_model_path
        or (
            config_policy.model_version_folder(version=base_model, field="base_model_id")
            if base_model is not None
            else ""
        )
    )
    if model_path:
        config["model_name_or_path"] = model_path
    try:
        training_config_validate(
            recipe=recipe, config=config_policy.training_config_for_cli(config=config)
        )
    except InvalidTrainingConfig as exc:
        # The library names the folders it checked; the caller learns the field only.
        raise InvalidTrainingConfig(
            config_policy.paths_redact(exc.message), field=exc.field
        ) from exc

    run = TrainingRun.objects.create(
        recipe=recipe,
        config=config,
        dataset_version=dataset_version,
        dataset_path="" if dataset_version is not None else data_dir,
        base_model=base_model,
        base_model_path=model_path,
        project=project,
        created_by=user if (user is not None and user.is_authenticated) else None,
    )
    run.output_dir = str(training_output_root() / f"run-{run.pk}")
    run.save(update_fields=["output_dir"])
    if enqueue:
        training_run_enqueue(run=run)
    return run


def training_run_enqueue(*, run: TrainingRun, send: Callable[[int], Any] | None = None) -> None:
    """Send the run's task to the gpu queue after the current transaction commits.

    The time is noted on the row (`enqueued_at`), so a run whose message a restarted broker
    lost can be told apart (`training_runs_requeue_lost`). `send(run_id)` replaces the
    default `run_training.delay`, e.g. to send through another broker connection.
    """
    from training.tasks import run_training

    run_id = run.pk
    run.enqueued_at = timezone.now()
    TrainingRun.objects.filter(pk=run_id).update(enqueued_at=run.enqueued_at)
    transaction.on_commit(lambda: (send or run_training.delay)(run_id))


def training_run_data_dir(*, run: TrainingRun) -> str:
    """Return the snapshot folder the run trains on."""
    if run.dataset_version_id is not None:
        return run.dataset_version.path
    return run.dataset_path


# --------------------------------------------------------------------------- claim


@dataclass
class Claim:
    run: TrainingRun
    attempt: int
    resume_from: str | None
    dropped_checkpoints: list[str] = field(default_factory=list)


def _this_host() -> str:
    return socket.gethostname()


def training_run_worker_gone(*, run: TrainingRun, now=None) -> bool:
    """Return whether a run marked running has no live supervisor.

    Gone: no heartbeat for TRAINING_HEARTBEAT_STALE_SECONDS, or its supervisor ran on this
    host and that process is dead (or is this very process, which is not supervising it).
    """
    now = now or timezone.now()
    stale = float(_setting("TRAINING_HEARTBEAT_STALE_SECONDS", 60))
    if run.heartbeat_at is None or (now - run.heartbeat_at).total_seconds() > stale:
        return True
    if run.worker_host == _this_host():
        if run.worker_pid is None or run.worker_pid == os.getpid():
            return True
        if not psutil.pid_exists(run.worker_pid):
            return True
        with contextlib.suppress(psutil.Error):
            if psutil.Process(run.worker_pid).status() == psutil.STATUS_ZOMBIE:
                return True
    return False


def _checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    found = []
    with contextlib.suppress(OSError):
        for entry in Path(output_dir).iterdir():
            match = _CHECKPOINT_RE.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def checkpoint_complete(path: Path) -> bool:
    """Return whether a checkpoint folder was written to the end.

    transformers writes ``trainer_state.json`` last, straight into ``checkpoint-N``; the PPO
    recipe keeps it in ``ppo_state/``. A worker killed mid-save leaves a folder without it.
    """
    for state in (path / "trainer_state.json", *path.glob("*/trainer_state.json")):
        if read_json(state) is not None:
            return True
    return False


def last_checkpoint(output_dir: str | Path) -> tuple[str, int] | None:
    """Return the newest complete ``checkpoint-N`` folder in ``output_dir`` and its step."""
    for step, path in reversed(_checkpoints(output_dir)):
        if checkpoint_complete(path):
            return str(path), step
    return None


def _drop_incomplete_checkpoints(output_dir: str | Path) -> list[str]:
    """Delete half-written checkpoints so that ``--resume`` picks a complete one."""
    dropped = []
    for _step, path in _checkpoints(output_dir):
        if not checkpoint_complete(path):
            shutil.rmtree(path, ignore_errors=True)
            dropped.append(path.name)
    return dropped


def _claim(run_id: int, task_id: str) -> Claim | None:
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
        if run.status == TrainingRun.Status.RUNNING and not training_run_worker_gone(run=run):
            logger.info(
                "training run %s is running on %s pid %s", run_id, run.worker_host, run.worker_pid
            )
            return None
        if run.status == TrainingRun.Status.RUNNING:
            _kill_stale_child(run)
        now = timezone.now()
        dropped = _drop_incomplete_checkpoints(run.output_dir) if run.output_dir else []
        checkpoint = last_checkpoint(run.output_dir) if run.output_dir else None
        run.attempts += 1
        if checkpoint is not None:
            run.resumes = [
                *run.resumes,
                {
                    "attempt": run.attempts,
                    "checkpoint": checkpoint[0],
                    "step": checkpoint[1],
                    "at": now.isoformat(),
                },
            ]
        run.status = TrainingRun.Status.RUNNING
        run.worker_host = _this_host()
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


# --------------------------------------------------------------------------- processes


def _group_members(pgid: int, output_dir: str = "") -> list[psutil.Process]:
    """Return the live processes of group ``pgid`` that are a training CLI (of ``output_dir``)."""
    members = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
        except OSError:
            continue
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if CLI_MODULE in cmdline and (not output_dir or output_dir in cmdline):
            members.append(proc)
    return members


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_stale_child(run: TrainingRun) -> None:
    """Kill a training process left behind on this host by a supervisor that died."""
    if (
        run.child_pid
        and run.worker_host == _this_host()
        and _group_members(run.child_pid, run.output_dir)
    ):
        logger.warning("killing orphaned training process group %s", run.child_pid)
        _signal_group(run.child_pid, signal.SIGKILL)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Ask Linux to SIGTERM the training process when its supervisor dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def training_command(
    *, recipe: str, config_path: Path, data_dir: str, output_dir: str, resume: bool
) -> list[str]:
    """Return the command line of the training CLI under the configured launcher.

    TRAINING_LAUNCHER: "python" (default) runs ``python -m training.trainers.cli``;
    "accelerate" runs ``accelerate launch [TRAINING_ACCELERATE_ARGS] -m ...``; a list is
    used as the prefix before ``-m training.trainers.cli``.
    """
    launcher = _setting("TRAINING_LAUNCHER", "python") or "python"
    if isinstance(launcher, list | tuple):
        prefix = [*launcher]
    elif launcher == "accelerate":
        prefix = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            *_setting("TRAINING_ACCELERATE_ARGS", []),
        ]
    elif launcher == "python":
        prefix = [sys.executable]
    else:
        raise ImproperlyConfiguredLauncher(f"TRAINING_LAUNCHER={launcher!r}")
    command = [
        *prefix,
        "-m",
        CLI_MODULE,
        "--recipe",
        recipe,
        "--config",
        str(config_path),
        "--data",
        str(data_dir),
        "--out",
        str(output_dir),
    ]
    if resume:
        command.append("--resume")
    return command


def _prepare_output_dir(path: Path) -> None:
    """Make sure the artefact folder exists, is writable and has room; raise ArtifactError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ArtifactError(f"Disk full: cannot write to the artefact folder {path}.") from exc
        raise ArtifactError(
            f"The artefact folder {path} is not writable: {exc.strerror or exc}."
        ) from exc
    free = shutil.disk_usage(path).free
    needed = int(_setting("TRAINING_MIN_FREE_BYTES", 1 << 30))
    if free < needed:
        raise ArtifactError(
            f"Disk full: {free / 2**20:.0f} MiB free in {path}, the run needs at least "
            f"{needed / 2**20:.0f} MiB (TRAINING_MIN_FREE_BYTES)."
        )


# --------------------------------------------------------------------------- reading files


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
            event = record.get("event")
            if event == "checkpoint" and record.get("path"):
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


@dataclass
class Progress:
    """What an ``on_progress`` callback receives about once a second."""

    run_id: int
    step: int
    max_steps: int
    fraction: float
    metrics: dict[str, Any]
    status: str


# --------------------------------------------------------------------------- execute


def training_run_execute(
    *,
    run_id: int,
    task_id: str = "",
    on_progress: Callable[[Progress], None] | None = None,
) -> TrainingRun | None:
    """Run the training CLI for a run to its end and record the outcome on the row.

    Safe to call any number of times for the same run: a finished, cancelled or failed run
    is left alone, a run supervised elsewhere (fresh heartbeat) is left alone, and a run
    whose supervisor died resumes from its newest checkpoint.
    """
    claim = _claim(run_id, task_id)
    if claim is None:
        return TrainingRun.objects.filter(pk=run_id).first()
    run = claim.run
    output_dir = Path(run.output_dir)
    try:
        _prepare_output_dir(output_dir)
    except ArtifactError as exc:
        return _record_failure(run.pk, claim.attempt, str(exc), exit_code=None, tail="")

    files = RunFiles(output_dir=output_dir, log_lines=int(_setting("TRAINING_LOG_TAIL_LINES", 50)))
    run_json = read_json(output_dir / "run.json") or {}
    if run_json.get("status") == "finished" and (output_dir / "final").is_dir():
        # The process finished but its supervisor died before recording it: just record.
        files.poll()
        return _record_exit(run.pk, claim.attempt, 0, files)

    try:
        cli_config = config_policy.training_config_for_cli(config=run.config)
    except InvalidTrainingConfig as exc:  # the deployment unregistered its reward function
        return _record_failure(run.pk, claim.attempt, exc.message, exit_code=None, tail="")
    try:
        config_path = output_dir / CONFIG_FILE
        config_path.write_text(json.dumps(cli_config, indent=2, sort_keys=True) + "\n")
        command = training_command(
            recipe=run.recipe,
            config_path=config_path,
            data_dir=training_run_data_dir(run=run),
            output_dir=str(output_dir),
            resume=claim.resume_from is not None,
        )
        log = (output_dir / LOG_FILE).open("ab")
    except OSError as exc:
        reason = "Disk full" if exc.errno == errno.ENOSPC else "The artefact folder is not writable"
        return _record_failure(run.pk, claim.attempt, f"{reason}: {exc}", exit_code=None, tail="")
    except ImproperlyConfiguredLauncher as exc:
        return _record_failure(
            run.pk, claim.attempt, f"Unknown launcher: {exc}", exit_code=None, tail=""
        )
    with log:
        files.log_start = log.tell()
        header = f"=== attempt {claim.attempt} on {_this_host()}: {' '.join(command)}\n"
        if claim.dropped_checkpoints:
            dropped = ", ".join(claim.dropped_checkpoints)
            header += f"=== deleted half-written checkpoints: {dropped}\n"
        if claim.resume_from:
            header += f"=== resuming from {claim.resume_from}\n"
        log.write(header.encode())
        log.flush()
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(settings.BASE_DIR),
                env=_child_env(),
                start_new_session=True,  # its own process group: cancel kills all of it
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            return _record_failure(
                run.pk,
                claim.attempt,
                f"Could not start the training process ({command[0]}): {exc}",
                exit_code=None,
                tail="",
            )
    try:
        TrainingRun.objects.filter(pk=run.pk, attempts=claim.attempt).update(child_pid=process.pid)
        exit_code = _supervise(run.pk, claim.attempt, process, files, on_progress)
    finally:
        if process.poll() is None:
            _terminate(process)
        _signal_group(process.pid, signal.SIGKILL)  # leftovers such as dataloader workers
    if exit_code is None:  # taken over by another supervisor, or put back in the queue
        return TrainingRun.objects.filter(pk=run.pk).first()
    files.poll()
    return _record_exit(run.pk, claim.attempt, exit_code, files)


def _child_env() -> dict[str, str]:
    """Return the training process's environment: what torch and the launcher need, no secrets.

    The process reads and writes files only; the database URL, secret key, broker URL and
    cloud or hub credentials of the worker stay out of a process that runs model code.
    """
    extra = set(settings.PREFLOOP_TRAINING_ENV_PASSTHROUGH)
    env = {
        name: value
        for name, value in os.environ.items()
        if name in extra
        or name in CHILD_ENV_NAMES
        or (name.startswith(CHILD_ENV_PREFIXES) and not CHILD_ENV_SECRET.search(name))
    }
    env["PYTHONUNBUFFERED"] = "1"
    base = str(settings.BASE_DIR)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (base, env.get("PYTHONPATH", "")) if p)
    return env


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL it after TRAINING_KILL_GRACE_SECONDS."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=float(_setting("TRAINING_KILL_GRACE_SECONDS", 10)))
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()


def _supervise(
    run_id: int,
    attempt: int,
    process: subprocess.Popen,
    files: RunFiles,
    on_progress: Callable[[Progress], None] | None,
) -> int | None:
    """Stream progress into the row until the process exits; return its exit code.

    Return None when the row says another supervisor owns the run (the process is killed).
    A cancelled run has its process group terminated and its exit code returned.
    """
    poll = float(_setting("TRAINING_POLL_SECONDS", 1.0))
    max_runtime = float(_setting("TRAINING_MAX_RUNTIME_SECONDS", 0) or 0)
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
        if state == TrainingRun.Status.CANCELLED:
            _terminate(process)
            return process.returncode
        if state == "lost":
            logger.warning("training run %s was taken over; stopping attempt %s", run_id, attempt)
            _terminate(process)
            return None
        if max_runtime and time.monotonic() - started > max_runtime:
            with files.log_path.open("a") as log:
                log.write(f"=== stopping: over TRAINING_MAX_RUNTIME_SECONDS={max_runtime:.0f}\n")
            _terminate(process)
            return process.returncode


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
            run.current_metrics = {**files.metrics(), **_numbers(final_metrics)}
            model_version_register(run=run, final_metrics=final_metrics, run_json=run_json)
        run.save()
    return run


def _numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, int | float | str | bool)}


def model_version_register(
    *, run: TrainingRun, final_metrics: dict[str, Any], run_json: dict[str, Any] | None = None
) -> ModelVersion:
    """Return the run's registry entry, creating it once (keyed by the run)."""
    run_json = run_json or {}
    eval_results = {
        k: v for k, v in _numbers(final_metrics).items() if k.startswith(("eval_", "test_"))
    }
    for key in ("global_step", "train_loss", "train_runtime"):
        if key in final_metrics:
            eval_results[key] = final_metrics[key]
    data = run_json.get("data") or {}
    if data.get("hash"):
        eval_results["data_hash"] = data["hash"]
    name = f"{run.recipe}-run-{run.pk}"
    if ModelVersion.objects.filter(name=name).exclude(training_run=run).exists():
        name = f"{name}-{timezone.now():%Y%m%d%H%M%S}"
    version, _created = ModelVersion.objects.get_or_create(
        training_run=run,
        defaults={
            "name": name,
            "kind": (
                ModelVersion.Kind.REWARD
                if run.recipe == Recipe.REWARD
                else ModelVersion.Kind.POLICY
            ),
            "artifact_path": str(Path(run.output_dir) / "final"),
            "base_model_path": run.base_model_path or run.config.get("model_name_or_path", ""),
            "parent": run.base_model,
            "dataset_version": run.dataset_version,
            "eval_results": eval_results,
        },
    )
    return version


def training_run_fail(*, run_id: int, error: str) -> None:
    """Mark a run failed with ``error`` unless it already ended (the task's on_failure hook)."""
    TrainingRun.objects.filter(pk=run_id).exclude(status__in=TERMINAL_STATUSES).update(
        status=TrainingRun.Status.FAILED,
        error=config_policy.paths_redact(error[-20000:]),
        finished_at=timezone.now(),
    )


# --------------------------------------------------------------------------- cancel, resume


def training_run_cancel(*, run_id: int) -> TrainingRun:
    """Cancel a queued or running run and kill its training process group.

    Cancelling a cancelled run is a no-op; a run that already succeeded or failed is a
    Conflict. On another host the supervisor sees the flag on its next poll and kills it.
    """
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise NotFound("No such training run.")
        if run.status == TrainingRun.Status.CANCELLED:
            return run
        if run.status in TERMINAL_STATUSES:
            raise Conflict(f"Training run {run_id} already {run.status}.")
        run.status = TrainingRun.Status.CANCELLED
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "finished_at"])
        child, host, output_dir = run.child_pid, run.worker_host, run.output_dir
    if child and host == _this_host() and _group_members(child, output_dir):
        _signal_group(child, signal.SIGTERM)
    return run


def training_run_resume(*, run_id: int, enqueue: bool = True) -> TrainingRun:
    """Put a failed, cancelled or orphaned run back in the queue; it resumes from a checkpoint."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise NotFound("No such training run.")
        if run.status == TrainingRun.Status.SUCCEEDED:
            raise Conflict(f"Training run {run_id} already succeeded.")
        if run.status == TrainingRun.Status.RUNNING and not training_run_worker_gone(run=run):
            raise Conflict(f"Training run {run_id} is running on {run.worker_host}.")
        run.status = TrainingRun.Status.QUEUED
        run.error = ""
        run.finished_at = None
        run.exit_code = None
        run.save(update_fields=["status", "error", "finished_at", "exit_code"])
        if enqueue:
            training_run_enqueue(run=run)
    return run


def broker_started_at(*, url: str | None = None):
    """Return when the Redis broker last started, or None (another broker, or no answer).

    Redis reports its uptime in whole seconds, so this errs late by under a second: a run
    sent in that second may be sent twice, which the idempotent task shrugs off.
    """
    import redis

    url = url or settings.CELERY_BROKER_URL
    if not str(url).startswith(("redis://", "rediss://")):
        return None
    try:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        uptime = int(client.info("server")["uptime_in_seconds"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        logger.warning("cannot read the broker's uptime", exc_info=True)
        return None
    return timezone.now() - timedelta(seconds=uptime)


def training_runs_requeue_lost(
    *, broker_started_at, send: Callable[[int], Any] | None = None
) -> list[int]:
    """Send again the queued runs whose task was sent before the broker last started.

    A broker that keeps nothing on disk loses its queues when it restarts, and a run still
    queued from before would wait for ever. Sending again is safe when the message did
    survive (an append-only Redis): the task is idempotent, and a second delivery of a run
    that is running or finished changes nothing.
    """
    from django.db.models import Q

    lost = TrainingRun.objects.filter(status=TrainingRun.Status.QUEUED).filter(
        Q(enqueued_at__lt=broker_started_at)
        | Q(enqueued_at__isnull=True, created_at__lt=broker_started_at)
    )
    runs = list(lost.only("pk"))
    for run in runs:
        logger.warning("training run %s: queued before the broker restarted; sent again", run.pk)
        training_run_enqueue(run=run, send=send)
    return [run.pk for run in runs]


def training_runs_requeue_stale() -> list[int]:
    """Re-queue running runs whose heartbeat is stale; their task resumes them once."""
    stale = float(_setting("TRAINING_HEARTBEAT_STALE_SECONDS", 60))
    cutoff = timezone.now() - timedelta(seconds=stale)
    run_ids = list(
        TrainingRun.objects.filter(
            status=TrainingRun.Status.RUNNING, heartbeat_at__lt=cutoff
        ).values_list("pk", flat=True)
    )
    from training.tasks import run_training

    for run_id in run_ids:
        transaction.on_commit(lambda run_id=run_id: run_training.delay(run_id))
    return run_ids
