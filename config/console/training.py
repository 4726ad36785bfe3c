"""Console pages for training: a form per recipe, the runs with live progress, cancel, resume.

Only the project's researchers and staff reach them (`config.console.access`: 404 outside
one's projects, 403 for annotators and reviewers). A run is started by the same calls as the
API's (`config_policy.model_version_for_run`, `services.training_run_create`), so the page
refuses what the API refuses, with the field named, and writes nothing when it refuses. The
runs list and a run's progress and log are htmx partials polled every few seconds; a run that
has ended answers 286, which tells htmx to stop polling.
"""

from __future__ import annotations

import json
import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from annotation.errors import ServiceError
from annotation.models import Project
from config.console.access import console_project
from config.console.context import console_context
from config.console.training_forms import TrainingRunForm, project_dataset_versions, recipes
from training import config_policy, services
from training.models import Recipe, TrainingRun

POLL_SECONDS = 3
HTMX_STOP_POLLING = 286
# Where a service names a field the form shows under another name.
FORM_FIELD_OF = {"model_name_or_path": "base_model_id", "dataset_path": "dataset_version_id"}


def _project(request: HttpRequest, project_id: int) -> Project:
    return console_project(user=request.user, project_id=project_id)


def _run(project: Project, run_id: int) -> TrainingRun:
    return get_object_or_404(
        TrainingRun.objects.select_related("dataset_version", "base_model"),
        project=project,
        pk=run_id,
    )


def _runs(project: Project):
    return (
        TrainingRun.objects.filter(project=project)
        .select_related("dataset_version", "base_model")
        .order_by("-created_at", "-pk")
    )


def _context(request: HttpRequest, project: Project, **extra) -> dict:
    return console_context(
        request=request, project=project, section="training", poll_seconds=POLL_SECONDS, **extra
    )


def _run_view(run: TrainingRun) -> dict:
    """Return what the page shows of a run; server paths outside its folder are hidden."""
    metrics = run.current_metrics or {}
    return {
        "run": run,
        "percent": round(100 * min(1.0, max(0.0, run.progress or 0.0))),
        "step": metrics.get("step"),
        "max_steps": metrics.get("max_steps"),
        "loss": metrics.get("loss"),
        "config_items": [
            (key, config_policy.paths_redact(json.dumps(value), keep=run.output_dir))
            for key, value in sorted((run.config or {}).items())
        ],
        "log": config_policy.paths_redact(run.log_tail, keep=run.output_dir),
        "error": config_policy.paths_redact(run.error, keep=run.output_dir),
        "active": run.status not in services.TERMINAL_STATUSES,
        "can_cancel": run.status in (TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING),
        "can_resume": run.status in (TrainingRun.Status.FAILED, TrainingRun.Status.CANCELLED),
    }


def _error_field(form: TrainingRunForm, exc: ServiceError) -> str | None:
    """Return the form field a refusal names (by its ``field``, else the first name it says)."""
    named = getattr(exc, "field", "") or exc.message.split(":", 1)[0]
    name = named.removeprefix("config.").split(".")[0]
    name = FORM_FIELD_OF.get(name, name)
    if name in form.fields:
        return name
    said = [
        (found.start(), FORM_FIELD_OF.get(field, field))
        for field in [*form.fields, *FORM_FIELD_OF]
        if (found := re.search(rf"(?<![\w.]){re.escape(field)}(?!\w)", exc.message))
    ]
    return min(said)[1] if said else None


@login_required
@require_GET
def training_home(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the recipes to start a run with and the project's runs, refreshed while they run."""
    project = _project(request, project_id)
    context = _context(
        request,
        project,
        recipes=recipes(),
        runs=[_run_view(run) for run in _runs(project)],
        has_data=project_dataset_versions(project=project).exists(),
    )
    return render(request, "console/training.html", context)


@login_required
@require_GET
def training_runs_live(request: HttpRequest, project_id: int) -> HttpResponse:
    """Return the runs table alone (htmx polls it)."""
    project = _project(request, project_id)
    context = _context(request, project, runs=[_run_view(run) for run in _runs(project)])
    return render(request, "console/training_runs.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def training_run_new(request: HttpRequest, project_id: int, recipe: str) -> HttpResponse:
    """Show a recipe's form; start the run it describes, or show what is wrong, by field."""
    project = _project(request, project_id)
    if recipe not in Recipe.values:
        raise Http404("No such recipe.")
    form = TrainingRunForm(request.POST or None, recipe=recipe, project=project)
    if request.method == "POST" and form.is_valid():
        try:
            run = _start(request, project, form)
        except ServiceError as exc:
            form.add_error(_error_field(form, exc), exc.message)
        else:
            messages.success(request, f"Run {run.pk} queued.")
            return redirect("console:training-run", project.pk, run.pk)
    context = _context(request, project, form=form, recipe=recipe, label=Recipe(recipe).label)
    status = 400 if form.errors else 200
    return render(request, "console/training_new.html", context, status=status)


def _start(request: HttpRequest, project: Project, form: TrainingRunForm) -> TrainingRun:
    """Start the run as the API does: the same id checks, then the one create service."""
    dataset_version = project_dataset_versions(project=project).get(
        pk=form.cleaned_data["dataset_version_id"]
    )
    base_model = form.base_model()
    if base_model is not None:
        base_model = config_policy.model_version_for_run(
            user=request.user, project=project, version_id=base_model.pk, field="base_model_id"
        )
    return services.training_run_create(
        recipe=form.recipe,
        config=form.config(),
        dataset_version=dataset_version,
        base_model=base_model,
        project=project,
        user=request.user,
    )


@login_required
@require_GET
def training_run_detail(request: HttpRequest, project_id: int, run_id: int) -> HttpResponse:
    """Show one run: its settings, progress and log (refreshed while it runs)."""
    project = _project(request, project_id)
    run = _run(project, run_id)
    context = _context(request, project, **_run_view(run))
    return render(request, "console/training_run.html", context)


@login_required
@require_GET
def training_run_live(request: HttpRequest, project_id: int, run_id: int) -> HttpResponse:
    """Return a run's progress and log alone (htmx polls it until the run ends)."""
    project = _project(request, project_id)
    view = _run_view(_run(project, run_id))
    status = 200 if view["active"] else HTMX_STOP_POLLING
    return render(
        request, "console/training_run_live.html", _context(request, project, **view), status=status
    )


def _act(request: HttpRequest, project_id: int, run_id: int, service, done: str) -> HttpResponse:
    project = _project(request, project_id)
    run = _run(project, run_id)
    try:
        service(run_id=run.pk)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Run {run.pk} {done}.")
    return redirect("console:training-run", project.pk, run.pk)


@login_required
@require_POST
def training_run_cancel(request: HttpRequest, project_id: int, run_id: int) -> HttpResponse:
    """Cancel a queued or running run (its training process is stopped)."""
    return _act(request, project_id, run_id, services.training_run_cancel, "cancelled")


@login_required
@require_POST
def training_run_resume(request: HttpRequest, project_id: int, run_id: int) -> HttpResponse:
    """Queue a failed or cancelled run again; it continues from its newest checkpoint."""
    return _act(request, project_id, run_id, services.training_run_resume, "queued again")
