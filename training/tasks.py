"""Celery tasks of the training app (routed to the `gpu` queue by CELERY_TASK_ROUTES)."""

from __future__ import annotations

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError

from training import registry, services, supervisor


class TrainingTask(Task):
    """Record a task's final failure, with its traceback, on the run's row."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        run_id = kwargs.get("run_id", args[0] if args else None)
        if run_id is not None:
            services.training_run_fail(
                run_id=run_id, error=f"The training task crashed: {exc!r}\n{einfo}"
            )


@shared_task(
    bind=True,
    base=TrainingTask,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
)
def run_training(self, run_id: int) -> str | None:
    """Run one training run to its end; a finished or live run is left alone."""
    run = supervisor.training_run_execute(run_id=run_id, task_id=self.request.id or "")
    return run.status if run is not None else None


@shared_task(acks_late=True, queue="default")  # light work: stays off the gpu queue
def requeue_stale_runs() -> list[int]:
    """Re-queue running runs whose supervisor stopped sending heartbeats, and queued runs
    whose message a restarted broker lost (scheduled with beat every minute)."""
    started = services.broker_started_at()
    lost = services.training_runs_requeue_lost(broker_started_at=started) if started else []
    return services.training_runs_requeue_stale() + lost


class ValidationTask(Task):
    """Record a validation task's final failure on the model version's row."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        version_id = kwargs.get("version_id", args[0] if args else None)
        if version_id is not None:
            registry.model_version_validation_fail(version_id=version_id, error=repr(exc))


# Loading a model once on a CPU is enough to validate it: the `default` queue of the CPU
# workers (worker-cpu in docker-compose.yml), not a GPU worker's.
@shared_task(
    base=ValidationTask,
    queue="default",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=5,
    max_retries=5,
)
def validate_model_version(version_id: int) -> str | None:
    """Validate a registered model version; a version already decided is left alone."""
    version = registry.model_version_validate(version_id=version_id)
    return version.status if version is not None else None


class GenerationTask(Task):
    """Record a generation task's final failure on its job; the job opens no round."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        from training import rounds

        job_id = kwargs.get("job_id", args[0] if args else None)
        if job_id is not None:
            rounds.generation_job_fail(job_id=job_id, error=f"The generation task crashed: {exc!r}")


@shared_task(
    base=GenerationTask,
    queue="gpu",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=5,
    max_retries=5,
)
def run_generation_job(job_id: int) -> str | None:
    """Generate a round from registered policies; a finished job is left alone."""
    from training import rounds

    job = rounds.generation_job_run(job_id=job_id)
    return job.status if job is not None else None
