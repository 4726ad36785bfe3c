"""Imports run by a Celery task: a large upload is stored, queued, and imported off the request.

The task runs the same importers as a request does (every line validated first, then one
transaction; every bad line reported on the job) and records its progress on the job row: the
share of the stored file read so far, over both passes. Progress written while the import's
transaction is open goes through a second database connection, so readers see it at once
(PostgreSQL only; SQLite allows one writer, so the demo shows progress for the first pass).
"""

from __future__ import annotations

import gzip
import time
import uuid
import zlib
from datetime import timedelta
from pathlib import Path
from typing import IO

from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from annotation.errors import ServiceError
from annotation.imports.items import items_import
from annotation.imports.limits import ImportFailed, ImportTooLarge
from annotation.imports.preferences import preferences_import
from annotation.models import ImportJob, Project, Round

PROGRESS_EVERY_SECONDS = 0.5
# A running job whose row was not touched for this long lost its worker; it may run again.
STALE_AFTER_SECONDS = 120


def open_import_file(fileobj: IO[bytes], name: str) -> IO[bytes]:
    """Return a stream of the file's lines, through gzip when its name ends in .gz."""
    return gzip.GzipFile(fileobj=fileobj, mode="rb") if name.endswith(".gz") else fileobj


def import_job_create(*, project: Project, user, kind: str, upload, options: dict) -> ImportJob:
    """Store an upload under the artefact root and queue its import once this commits."""
    from annotation import tasks

    folder = Path(settings.ARTIFACT_ROOT) / "imports" / str(project.pk)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (uuid.uuid4().hex + (".gz" if upload.name.endswith(".gz") else ""))
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    job = ImportJob.objects.create(
        project=project,
        kind=kind,
        options=options,
        file_name=upload.name[:255],
        path=str(path),
        size_bytes=path.stat().st_size,
        created_by=user if getattr(user, "pk", None) else None,
    )
    tasks.run_import_job_on_commit(job.pk)
    return job


class _ProgressWriter:
    """Record on the job row how much of the stored file the importer has read."""

    def __init__(self, job: ImportJob, raw: IO[bytes]):
        self.job_id, self.raw, self.size = job.pk, raw, max(job.size_bytes, 1)
        self.passes, self.position, self.last = 0, 0, 0.0
        self.side = None

    def __call__(self, _rows: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_SECONDS:
            return
        self.last = now
        position = self.raw.tell()
        if position < self.position:  # the importer rewound the file: its second pass
            self.passes += 1
        self.position = position
        done = min(self.passes, 1) + min(position / self.size, 1.0)
        self.write("validating" if self.passes == 0 else "writing", min(done / 2, 0.99))

    def write(self, phase: str, progress: float) -> None:
        if not connection.in_atomic_block:
            ImportJob.objects.filter(pk=self.job_id).update(
                phase=phase, progress=progress, updated_at=timezone.now()
            )
            return
        if connection.vendor != "postgresql":
            return
        if self.side is None:
            self.side = connections.create_connection("default")
        with self.side.cursor() as cursor:
            cursor.execute(
                f"UPDATE {ImportJob._meta.db_table} SET phase = %s, progress = %s, "
                "updated_at = %s WHERE id = %s",
                [phase, progress, timezone.now(), self.job_id],
            )

    def close(self) -> None:
        if self.side is not None:
            self.side.close()


def _claim(import_job_id: int) -> ImportJob | None:
    """Mark a queued (or abandoned) job running; None when there is nothing to do."""
    with transaction.atomic():
        job = ImportJob.objects.select_for_update().filter(pk=import_job_id).first()
        if job is None or job.status in (ImportJob.Status.SUCCEEDED, ImportJob.Status.FAILED):
            return None
        stale = timezone.now() - timedelta(seconds=STALE_AFTER_SECONDS)
        if job.status == ImportJob.Status.RUNNING and job.updated_at > stale:
            return None  # another worker has it
        job.status, job.phase, job.progress = ImportJob.Status.RUNNING, "validating", 0.0
        job.started_at = timezone.now()
        job.save(update_fields=["status", "phase", "progress", "started_at", "updated_at"])
        return job


def _finish(job: ImportJob, **fields) -> ImportJob:
    for name, value in fields.items():
        setattr(job, name, value)
    job.phase, job.finished_at = "done", timezone.now()
    job.save()
    Path(job.path).unlink(missing_ok=True)
    return job


def _run(job: ImportJob, stream: IO[bytes], progress: _ProgressWriter) -> dict:
    options = job.options
    round_ = None
    if options.get("round_id") is not None:
        round_ = Round.objects.filter(project=job.project, pk=options["round_id"]).first()
        if round_ is None:
            raise ServiceError("The round this import was for no longer exists.", code="round")
    if job.kind == ImportJob.Kind.ITEMS:
        report = items_import(
            project=job.project,
            stream=stream,
            fmt=options.get("format", "jsonl"),
            round_=round_,
            progress=progress,
        )
        return report.__dict__
    return preferences_import(
        project=job.project,
        stream=stream,
        fmt=options["format"],
        batch=options.get("batch", ""),
        round_=round_,
        serve=options.get("serve", False),
        near_duplicates=options.get("near_duplicates", False),
        progress=progress,
    ).as_dict()


def import_job_run(*, import_job_id: int) -> ImportJob | None:
    """Run a queued import; a finished job, or one a live worker is running, is left alone."""
    job = _claim(import_job_id)
    if job is None:
        return ImportJob.objects.filter(pk=import_job_id).first()
    failed = ImportJob.Status.FAILED
    try:
        with Path(job.path).open("rb") as raw:
            progress = _ProgressWriter(job, raw)
            try:
                report = _run(job, open_import_file(raw, job.path), progress)
            finally:
                progress.close()
    except ImportFailed as exc:
        return _finish(
            job,
            status=failed,
            total_bad=exc.total_bad,
            errors=[{"line": line, "error": message} for line, message in exc.errors],
            error=f"{exc.total_bad} bad line(s); nothing was imported.",
        )
    except ImportTooLarge as exc:
        return _finish(job, status=failed, error=exc.message)
    except ServiceError as exc:  # e.g. the batch was imported before
        return _finish(job, status=failed, error=exc.message)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        return _finish(job, status=failed, error=f"Cannot read the file: {exc}")
    except BaseException:
        # Let the task retry it (a lost database connection): queued again, not abandoned.
        ImportJob.objects.filter(pk=job.pk).update(status=ImportJob.Status.QUEUED)
        raise
    return _finish(job, status=ImportJob.Status.SUCCEEDED, progress=1.0, report=report)


def import_job_fail(*, import_job_id: int, error: str) -> None:
    """Record a job's final failure (its task gave up); the stored upload is removed."""
    job = ImportJob.objects.filter(pk=import_job_id).first()
    if job is not None and job.status != ImportJob.Status.SUCCEEDED:
        _finish(job, status=ImportJob.Status.FAILED, error=error)
