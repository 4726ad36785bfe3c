"""The training process at the operating-system level: its command line, environment,
process group, and whether a run's supervisor is still alive.

The training CLI (``python -m training.trainers.cli``, or under ``accelerate launch``) runs in
its own process group, so cancelling kills the whole group, dataloader workers included.
Nothing here imports torch, so a worker keeps no GPU memory after a run.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
from django.conf import settings
from django.utils import timezone

from training.models import TrainingRun

logger = logging.getLogger(__name__)

CLI_MODULE = "training.trainers.cli"
# The training process's environment is built from these (see child_env).
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


def this_host() -> str:
    """Return the name the supervisor records as the run's host."""
    return socket.gethostname()


def training_run_worker_gone(*, run: TrainingRun, now=None) -> bool:
    """Return whether a run marked running has no live supervisor.

    Gone: no heartbeat for TRAINING_HEARTBEAT_STALE_SECONDS, or its supervisor ran on this
    host and that process is dead (or is this very process, which is not supervising it).
    """
    now = now or timezone.now()
    stale = float(settings.TRAINING_HEARTBEAT_STALE_SECONDS)
    if run.heartbeat_at is None or (now - run.heartbeat_at).total_seconds() > stale:
        return True
    if run.worker_host == this_host():
        if run.worker_pid is None or run.worker_pid == os.getpid():
            return True
        if not psutil.pid_exists(run.worker_pid):
            return True
        with contextlib.suppress(psutil.Error):
            if psutil.Process(run.worker_pid).status() == psutil.STATUS_ZOMBIE:
                return True
    return False


def group_members(pgid: int, output_dir: str = "") -> list[psutil.Process]:
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


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; return False when it is gone or not ours."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def orphan_kill(run: TrainingRun) -> None:
    """Kill a training process left behind on this host by a supervisor that died."""
    if (
        run.child_pid
        and run.worker_host == this_host()
        and group_members(run.child_pid, run.output_dir)
    ):
        logger.warning("killing orphaned training process group %s", run.child_pid)
        signal_group(run.child_pid, signal.SIGKILL)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Ask Linux to SIGTERM the training process when its supervisor dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def training_command(
    *,
    recipe: str,
    config_path: Path,
    data_dir: str,
    output_dir: str,
    resume: bool,
    accelerate_config: Path | None = None,
) -> list[str]:
    """Return the command line of the training CLI under the configured launcher.

    TRAINING_LAUNCHER: "python" (default) runs ``python -m training.trainers.cli``;
    "accelerate" runs ``accelerate launch [TRAINING_ACCELERATE_ARGS] -m ...``; a list is
    used as the prefix before ``-m training.trainers.cli``. A run that names one of the
    shipped accelerate configs (resolved by ``config_policy``) is always launched with
    ``accelerate launch --config_file <it> [TRAINING_ACCELERATE_ARGS]``, so the deployment's
    flags (``--num_processes 8``) still override the file.
    """
    launcher = settings.TRAINING_LAUNCHER or "python"
    if accelerate_config is not None:
        prefix = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(accelerate_config),
            *settings.TRAINING_ACCELERATE_ARGS,
        ]
    elif isinstance(launcher, list | tuple):
        prefix = [*launcher]
    elif launcher == "accelerate":
        prefix = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            *settings.TRAINING_ACCELERATE_ARGS,
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


def output_dir_prepare(path: Path) -> None:
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
    needed = int(settings.TRAINING_MIN_FREE_BYTES)
    if free < needed:
        raise ArtifactError(
            f"Disk full: {free / 2**20:.0f} MiB free in {path}, the run needs at least "
            f"{needed / 2**20:.0f} MiB (TRAINING_MIN_FREE_BYTES)."
        )


def accelerate_config_uses_cpu(path: Path) -> bool:
    """Return whether an accelerate config file asks for CPU processes (``use_cpu: true``)."""
    import yaml

    return bool((yaml.safe_load(path.read_text()) or {}).get("use_cpu"))


def child_env(*, accelerate_config: Path | None = None) -> dict[str, str]:
    """Return the training process's environment: what torch and the launcher need, no secrets.

    The process reads and writes files only; the database URL, secret key, broker URL and
    cloud or hub credentials of the worker stay out of a process that runs model code.
    """
    extra = set(settings.PREFLOOP_TRAINING_ENV_PASSTHROUGH)
    # Generation endpoints' keys stay out whatever their names (and the passthrough) say.
    endpoint_keys = {
        entry.get("api_key_env")
        for entry in settings.PREFLOOP_GENERATION_ENDPOINTS.values()
        if isinstance(entry, dict)
    }
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in endpoint_keys
        and (
            name in extra
            or name in CHILD_ENV_NAMES
            or (name.startswith(CHILD_ENV_PREFIXES) and not CHILD_ENV_SECRET.search(name))
        )
    }
    env["PYTHONUNBUFFERED"] = "1"
    if accelerate_config is not None and accelerate_config_uses_cpu(accelerate_config):
        # accelerate's torchrun launcher does not pass use_cpu on to the processes; without
        # this flag each one finds no GPU and trains alone instead of joining the gloo group.
        env["ACCELERATE_USE_CPU"] = "true"
    base = str(settings.BASE_DIR)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (base, env.get("PYTHONPATH", "")) if p)
    return env


# torchrun's report when one of its processes fails (torch.distributed.elastic): the first
# failure is the root cause, e.g. "rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 12)".
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
    re.DOTALL,
)


def rank_killed(launcher_output: str) -> str:
    """Return "rank N killed by signal NAME" when a multi-process launch ended because one of
    its processes was killed by a signal (the kernel's out-of-memory killer, a lost node),
    as torchrun reports it; "" otherwise (an exception in a rank is a failure of the run).

    torchrun terminates the other processes of the group itself once one is gone, so no rank
    is left waiting on a collective; the supervisor decides whether to restart the run.
    """
    found = _ROOT_CAUSE.search(launcher_output)
    if found is None or int(found.group(2)) >= 0:
        return ""
    number = -int(found.group(2))
    name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
    return f"rank {found.group(1)} killed by signal {name}"


def terminate(process: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL it after TRAINING_KILL_GRACE_SECONDS."""
    signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=float(settings.TRAINING_KILL_GRACE_SECONDS))
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.wait()


def process_start(
    *, command: list[str], log, accelerate_config: Path | None = None
) -> subprocess.Popen:
    """Start the training CLI in its own process group, writing to ``log``; raise OSError."""
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(settings.BASE_DIR),
        env=child_env(accelerate_config=accelerate_config),
        start_new_session=True,  # its own process group: cancel kills all of it
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
