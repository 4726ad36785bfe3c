"""Console pages for data in and out: import (preview, every bad line, queued jobs) and export.

Imports run exactly as the API runs them (`annotation.apis_imports.import_now_or_queue`): a
small file in the request, a large one as an ImportJob that a Celery worker imports while the
page polls its progress. Exports create a DatasetVersion built by a worker; its page polls
until the snapshot is ready, then lists the manifest and a download link for each file.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from annotation import exports, tasks
from annotation.apis_imports import import_now_or_queue
from annotation.errors import ServiceError
from annotation.imports import items_import, preferences_import
from annotation.models import DatasetVersion, ImportJob
from config.console.access import console_project
from config.console.context import console_context
from config.console.forms import ExportForm, ImportForm, upload_form

PREVIEW_ROWS = 5


def _data_page(request, project, *, status=200, import_form=None, export_form=None):
    context = console_context(
        request=request,
        project=project,
        section="data",
        import_form=import_form or ImportForm(),
        export_form=export_form or ExportForm(),
        jobs=ImportJob.objects.filter(project=project).order_by("-created_at")[:10],
        versions=DatasetVersion.objects.filter(project=project).order_by("-version")[:20],
        preview_rows=PREVIEW_ROWS,
    )
    return render(request, "console/data.html", context, status=status)


@login_required
@require_GET
def data_page(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the import form (with the formats), recent imports, the export form and versions."""
    project = console_project(user=request.user, project_id=project_id)
    return _data_page(request, project)


def _runner(project, kind: str, fmt: str):
    if kind == ImportJob.Kind.ITEMS:
        return lambda stream: items_import(project=project, stream=stream, fmt=fmt).__dict__
    return lambda stream: preferences_import(project=project, stream=stream, fmt=fmt).as_dict()


@login_required
@require_POST
def import_upload(request: HttpRequest, project_id: int) -> HttpResponse:
    """Import an uploaded file: the report, every bad line, or the queued job's progress."""
    project = console_project(user=request.user, project_id=project_id)
    form, status = upload_form(request, ImportForm)
    if status is not None:
        if request.headers.get("HX-Request"):
            return render(
                request, "console/_import_form_errors.html", {"form": form}, status=status
            )
        return _data_page(request, project, status=status, import_form=form)
    kind, fmt = form.cleaned_data["kind"], form.cleaned_data["format"]
    options = {"format": fmt, "round_id": None}
    if kind == ImportJob.Kind.PREFERENCES:
        options.update(batch="", serve=False, near_duplicates=False)
    response = import_now_or_queue(
        request=request,
        project=project,
        kind=kind,
        upload=form.cleaned_data["file"],
        options=options,
        run=_runner(project, kind, fmt),
    )
    body = response.data
    context = console_context(request=request, project=project)
    if response.status_code == 202:
        job = ImportJob.objects.get(pk=body["id"], project=project)
        return render(request, "console/_import_job.html", {**context, "job": job}, status=202)
    context.update(
        status_code=response.status_code,
        report=body if response.status_code == 201 else None,
        detail=body.get("detail", ""),
        errors=body.get("errors", []),
    )
    return render(request, "console/_import_result.html", context, status=response.status_code)


@login_required
@require_GET
def import_job(request: HttpRequest, project_id: int, job_id: int) -> HttpResponse:
    """Return a queued import's progress, report or bad lines (polled while it runs)."""
    project = console_project(user=request.user, project_id=project_id)
    job = get_object_or_404(ImportJob, project=project, pk=job_id)
    context = console_context(request=request, project=project, section="data", job=job)
    partial = request.headers.get("HX-Request")
    return render(
        request, "console/_import_job.html" if partial else "console/import_job.html", context
    )


@login_required
@require_POST
def export_create(request: HttpRequest, project_id: int) -> HttpResponse:
    """Queue a snapshot under the chosen policies and open its page."""
    project = console_project(user=request.user, project_id=project_id)
    form = ExportForm(request.POST)
    if not form.is_valid():
        return _data_page(request, project, status=400, export_form=form)
    dv = exports.dataset_version_create(
        project=project, policy=form.policy, name=form.cleaned_data["name"], user=request.user
    )
    tasks.build_dataset_version_on_commit(dv.pk)
    return redirect("console:dataset", project.pk, dv.version)


def _manifest(dv: DatasetVersion) -> dict | None:
    if dv.status != DatasetVersion.Status.READY or not dv.path:
        return None
    path = Path(dv.path) / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@login_required
@require_GET
def dataset_detail(request: HttpRequest, project_id: int, version: int) -> HttpResponse:
    """Show a snapshot: building (polled), failed with why, or its manifest and files."""
    project = console_project(user=request.user, project_id=project_id)
    dv = get_object_or_404(DatasetVersion, project=project, version=version)
    manifest = _manifest(dv)
    context = console_context(
        request=request,
        project=project,
        section="data",
        dv=dv,
        manifest=manifest,
        manifest_text=json.dumps(manifest, indent=2, ensure_ascii=False) if manifest else "",
        files=exports.dataset_file_list(dataset_version=dv),
        error_line=dv.error.splitlines()[0] if dv.error else "",
    )
    template = (
        "console/_dataset.html" if request.headers.get("HX-Request") else "console/dataset.html"
    )
    return render(request, template, context)


@login_required
@require_GET
def dataset_file(request: HttpRequest, project_id: int, version: int, name: str):
    """Download one file of a ready snapshot (the API's rule: the project's researchers)."""
    project = console_project(user=request.user, project_id=project_id)
    dv = get_object_or_404(DatasetVersion, project=project, version=version)
    try:
        path = exports.dataset_file_path(dataset_version=dv, name=name)
    except ServiceError as exc:
        raise Http404(exc.message) from exc
    content_type = "application/json" if name.endswith(".json") else "application/jsonl"
    return FileResponse(
        path.open("rb"), as_attachment=True, filename=name, content_type=content_type
    )
