"""Training runs: create, enqueue, cancel, resume, and register the model a run made.

Executing a run is the supervisor's job (``training/supervisor.py``); the operating-system
side of the training process lives in ``training/processes.py`` and the reading of its
output folder in ``training/run_files.py``.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from annotation.errors import Conflict, NotFound
from training import config_policy, processes
from training.config_policy import InvalidTrainingConfig
from training.models import ModelVersion, Recipe, TrainingRun

logger = logging.getLogger(__name__)

TERMINAL_STATUSES = (
    TrainingRun.Status.SUCCEEDED,
    TrainingRun.Status.FAILED,
    TrainingRun.Status.CANCELLED,
)


def training_output_root() -> Path:
    """Return the folder under which every run gets ``run-<id>/``."""
    root = settings.TRAINING_OUTPUT_ROOT
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
    project, data_dir = _dataset_folder(
        dataset_version=dataset_version, dataset_path=dataset_path, project=project
    )
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


def _dataset_folder(*, dataset_version, dataset_path, project) -> tuple[Any, str]:
    """Return the run's project and the checked snapshot folder it trains on."""
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
    return project, data_dir


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


def numbers_only(metrics: dict[str, Any]) -> dict[str, Any]:
    """Return the metrics whose values are numbers, strings or booleans."""
    return {k: v for k, v in metrics.items() if isinstance(v, int | float | str | bool)}


def model_version_register(
    *, run: TrainingRun, final_metrics: dict[str, Any], run_json: dict[str, Any] | None = None
) -> ModelVersion:
    """Return the run's registry entry, creating it once (keyed by the run)."""
    run_json = run_json or {}
    eval_results = {
        k: v for k, v in numbers_only(final_metrics).items() if k.startswith(("eval_", "test_"))
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
    if child and host == processes.this_host() and processes.group_members(child, output_dir):
        processes.signal_group(child, signal.SIGTERM)
    return run


def training_run_resume(*, run_id: int, enqueue: bool = True) -> TrainingRun:
    """Put a failed, cancelled or orphaned run back in the queue; it resumes from a checkpoint."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise NotFound("No such training run.")
        if run.status == TrainingRun.Status.SUCCEEDED:
            raise Conflict(f"Training run {run_id} already succeeded.")
        if run.status == TrainingRun.Status.RUNNING and not processes.training_run_worker_gone(
            run=run
        ):
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
    stale = float(settings.TRAINING_HEARTBEAT_STALE_SECONDS)
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
