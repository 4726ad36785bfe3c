"""Celery tasks of the annotation app: large dataset exports and imports, off the request."""

from __future__ import annotations

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError, transaction

from annotation import exports


class ExportTask(Task):
    """Record an export's final failure, with its traceback, on the DatasetVersion row."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        dataset_version_id = kwargs.get("dataset_version_id", args[0] if args else None)
        if dataset_version_id is not None:
            exports.dataset_version_fail(
                dataset_version_id=dataset_version_id,
                error=f"The export task failed: {exc!r}\n{einfo}",
            )


@shared_task(
    base=ExportTask,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
    ignore_result=True,
)
def build_dataset_version(dataset_version_id: int) -> str:
    """Build one dataset snapshot; a version that is ready or failed is left alone."""
    return exports.dataset_version_build(dataset_version_id=dataset_version_id).status


def build_dataset_version_on_commit(dataset_version_id: int) -> None:
    """Queue the build once the transaction that created the version has committed."""
    transaction.on_commit(lambda: build_dataset_version.delay(dataset_version_id))


class ImportTask(Task):
    """Record an import's final failure on its ImportJob row (details go to the worker log)."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        from annotation.imports import jobs as import_jobs

        import_job_id = kwargs.get("import_job_id", args[0] if args else None)
        if import_job_id is not None:
            import_jobs.import_job_fail(
                import_job_id=import_job_id,
                error=f"The import task failed ({type(exc).__name__}); the worker log has more.",
            )


@shared_task(
    base=ImportTask,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
    ignore_result=True,
)
def run_import_job(import_job_id: int) -> str:
    """Run one stored import; a finished job is left alone."""
    from annotation.imports import jobs as import_jobs

    job = import_jobs.import_job_run(import_job_id=import_job_id)
    return job.status if job is not None else "missing"


def run_import_job_on_commit(import_job_id: int) -> None:
    """Queue the import once the transaction that created the job has committed."""
    transaction.on_commit(lambda: run_import_job.delay(import_job_id))
