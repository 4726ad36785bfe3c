"""Celery tasks of the annotation app: building large dataset exports off the request."""

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
