"""What the import endpoints share: the upload size cap, 413s, and the choice to queue.

A request declaring a body above IMPORT_MAX_UPLOAD_BYTES is refused before it is read. A file
up to IMPORT_ASYNC_BYTES is imported in the request (201, or 400 with every bad line, or 413
at a size limit); a larger one is stored and imported by a Celery task (202 with the job, whose
status URL shows its progress and, at the end, its report or every bad line).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from typing import IO

from django.conf import settings
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response

from annotation.imports import ImportFailed, ImportTooLarge, size_text
from annotation.imports import jobs as import_jobs
from annotation.models import ImportJob, Project


@extend_schema_field(OpenApiTypes.BINARY)
class UploadField(serializers.FileField):
    """A file sent as a multipart part; the schema says binary, so the docs page offers a picker."""


class ImportJobOutput(serializers.ModelSerializer):
    status_url = serializers.SerializerMethodField()

    class Meta:
        model = ImportJob
        fields = [
            "id",
            "kind",
            "status",
            "phase",
            "progress",
            "file_name",
            "size_bytes",
            "options",
            "report",
            "errors",
            "total_bad",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "status_url",
        ]

    def get_status_url(self, job: ImportJob) -> str:
        return reverse("api-import-job", args=[job.project_id, job.pk])


def import_failed(exc: ImportFailed) -> Response:
    """Return the 400 of an import with bad lines: every bad line, and that nothing was written."""
    return Response(
        {
            "detail": f"{exc.total_bad} bad line(s); nothing was imported.",
            "code": "invalid_import",
            "errors": [{"line": line, "error": msg} for line, msg in exc.errors],
        },
        status=status.HTTP_400_BAD_REQUEST,
    )


def too_large(message: str, *, limit: int) -> Response:
    """Return the 413 of an import past a size limit, naming the limit."""
    return Response(
        {"detail": message, "code": "too_large", "field": "file", "limit_bytes": limit},
        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    )


def declared_upload_too_large(request) -> Response | None:
    """Return a 413 when the request declares a body above the upload cap, before reading it."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    limit = settings.IMPORT_MAX_UPLOAD_BYTES
    if declared > limit:
        return too_large(
            f"The upload is larger than {size_text(limit)}; nothing was imported.", limit=limit
        )
    return None


def import_now_or_queue(
    *,
    request,
    project: Project,
    kind: str,
    upload,
    options: dict,
    run: Callable[[IO[bytes]], dict],
) -> Response:
    """Run the import in the request, or queue it when the upload is large."""
    if upload.size > settings.IMPORT_MAX_UPLOAD_BYTES:  # sent without a Content-Length
        limit = settings.IMPORT_MAX_UPLOAD_BYTES
        return too_large(
            f"The upload is larger than {size_text(limit)}; nothing was imported.", limit=limit
        )
    if upload.size > settings.IMPORT_ASYNC_BYTES:
        job = import_jobs.import_job_create(
            project=project, user=request.user, kind=kind, upload=upload, options=options
        )
        data = ImportJobOutput(job).data
        return Response(
            data, status=status.HTTP_202_ACCEPTED, headers={"Location": data["status_url"]}
        )
    try:
        report = run(import_jobs.open_import_file(upload.file, upload.name))
    except ImportFailed as exc:
        return import_failed(exc)
    except ImportTooLarge as exc:
        return too_large(exc.message, limit=exc.limit)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or non-gzip .gz upload
        readable = isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile)
        reason = str(exc) if readable else "the upload could not be read"
        return Response(
            {"detail": f"cannot read the file: {reason}", "code": "file", "field": "file"},
            status=status.HTTP_400_BAD_REQUEST,
        )
    return Response(report, status=status.HTTP_201_CREATED)
