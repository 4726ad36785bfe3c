"""Console page of a project's prompt pool: its size and tags, an upload, and round generation.

The upload runs the API's importer (`annotation.prompt_pool.prompt_pool_import` through
`annotation.apis_pool.pool_import_response`): every bad line listed, nothing written unless all
are good. "Generate a round" calls the same service as the API
(`training.rounds.generation_job_create`), so it refuses what the API refuses, on the field it
names; the queued job's progress is an htmx fragment polled until the job ends (286 stops it).
Prompts are untrusted text: templates escape them.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from annotation.apis_pool import pool_import_response, pool_too_large
from annotation.errors import ServiceError
from annotation.imports.jobs import open_import_file
from annotation.models import Project, Round
from annotation.prompt_pool import DEFAULT_EVAL_FRACTION, prompt_pool_counts, prompt_pool_list
from config.console.access import console_project
from config.console.context import console_context
from config.console.forms import upload_form
from training import rounds
from training.models import GenerationJob

POLL_SECONDS = 2
HTMX_STOP_POLLING = 286
RECENT_PROMPTS = 20
RECENT_JOBS = 10


class PoolUploadForm(forms.Form):
    file = forms.FileField(
        help_text='A .jsonl (or .jsonl.gz) file: one {"prompt": "..."} or {"messages": [...]} '
        'per line, optional "tags" (a list of strings) and "id".'
    )
    eval_fraction = forms.FloatField(
        min_value=0,
        max_value=0.99,
        initial=DEFAULT_EVAL_FRACTION,
        help_text="Share of new prompts kept for evaluation, chosen by a hash of each prompt; "
        "no training round ever uses them.",
    )


class GenerateRoundForm(forms.Form):
    policies = forms.TypedMultipleChoiceField(
        coerce=int,
        widget=forms.CheckboxSelectMultiple,
        help_text="K samples: one policy. Side by side: one policy per answer shown.",
    )
    mode = forms.ChoiceField(
        choices=[
            ("k_samples", "K samples"),
            ("side_by_side", "Side by side"),
        ],
        initial="k_samples",
        help_text="K answers of one policy per prompt, or one answer of each policy.",
    )
    n_prompts = forms.IntegerField(
        min_value=1, initial=16, label="Prompts", help_text="Drawn from the pool, least used first."
    )
    temperature = forms.FloatField(initial=1.0, help_text="Sampling temperature (0.01 to 5).")
    max_new_tokens = forms.IntegerField(initial=64, help_text="Longest answer in tokens.")
    purpose = forms.ChoiceField(
        choices=Round.Purpose.choices,
        initial=Round.Purpose.TRAIN,
        help_text="A training round draws the pool's train split; an evaluation round its "
        "eval split and is never exported for training.",
    )

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["policies"].choices = [
            (v.pk, v.name) for v in rounds.project_policies_ready(project=project)
        ]


def _error_field(form: forms.Form, exc: ServiceError) -> str | None:
    """Return the form field a service refusal names (sampling settings map to their fields)."""
    name = getattr(exc, "field", "").rsplit(".", 1)[-1].split("[")[0]
    return name if name in form.fields else None


def _job_view(job: GenerationJob) -> dict:
    return {
        "job": job,
        "percent": round(100 * min(1.0, max(0.0, job.progress or 0.0))),
        "active": job.status in (GenerationJob.Status.QUEUED, GenerationJob.Status.RUNNING),
        "policy_names": [p.name for p in job.policies.all()],
    }


def _pool_page(
    request: HttpRequest,
    project: Project,
    *,
    status: int = 200,
    upload_form: PoolUploadForm | None = None,
    generate_form: GenerateRoundForm | None = None,
    job: GenerationJob | None = None,
) -> HttpResponse:
    jobs = GenerationJob.objects.filter(project=project).prefetch_related("policies")
    context = console_context(
        request=request,
        project=project,
        section="pool",
        poll_seconds=POLL_SECONDS,
        counts=prompt_pool_counts(project=project),
        prompts=prompt_pool_list(project=project)[:RECENT_PROMPTS],
        upload_form=upload_form or PoolUploadForm(),
        generate_form=generate_form or GenerateRoundForm(project=project),
        jobs=[_job_view(j) for j in jobs.order_by("-created_at", "-id")[:RECENT_JOBS]],
        new_job=_job_view(job) if job is not None else None,
    )
    return render(request, "console/pool.html", context, status=status)


@login_required
@require_GET
def pool_home(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the pool's counts and tags, the upload form, recent prompts and generation jobs."""
    project = console_project(user=request.user, project_id=project_id)
    return _pool_page(request, project)


@login_required
@require_POST
def pool_import(request: HttpRequest, project_id: int) -> HttpResponse:
    """Import an uploaded pool file: its counts, or every bad line (nothing imported)."""
    project = console_project(user=request.user, project_id=project_id)
    form, status = upload_form(request, PoolUploadForm)
    if status is not None:
        if request.headers.get("HX-Request"):
            return render(
                request, "console/_import_form_errors.html", {"form": form}, status=status
            )
        return _pool_page(request, project, status=status, upload_form=form)
    upload = form.cleaned_data["file"]
    if upload.size > settings.IMPORT_ASYNC_BYTES:
        response = pool_too_large()
    else:
        response = pool_import_response(
            project=project,
            stream=open_import_file(upload.file, upload.name),
            eval_fraction=form.cleaned_data["eval_fraction"],
        )
    body = response.data
    context = console_context(
        request=request,
        project=project,
        status_code=response.status_code,
        report=body if response.status_code == 201 else None,
        detail=body.get("detail", ""),
        errors=body.get("errors", []),
    )
    if request.headers.get("HX-Request"):
        return render(request, "console/_import_result.html", context, status=response.status_code)
    return _pool_page(request, project, status=response.status_code)


@login_required
@require_POST
def pool_generate(request: HttpRequest, project_id: int) -> HttpResponse:
    """Queue a round generated from the chosen policies; show its live progress."""
    project = console_project(user=request.user, project_id=project_id)
    form = GenerateRoundForm(request.POST, project=project)
    job = None
    if form.is_valid():
        data = form.cleaned_data
        try:
            job = rounds.generation_job_create(
                project=project,
                user=request.user,
                policies=data["policies"],
                mode=data["mode"],
                n_prompts=data["n_prompts"],
                sampling=[
                    {"temperature": data["temperature"], "max_new_tokens": data["max_new_tokens"]}
                ],
                purpose=data["purpose"],
            )
        except ServiceError as exc:
            form.add_error(_error_field(form, exc), exc.message)
    status = 202 if job is not None else 400
    if request.headers.get("HX-Request"):
        if job is None:
            return render(request, "console/_import_form_errors.html", {"form": form}, status=400)
        context = console_context(
            request=request, project=project, poll_seconds=POLL_SECONDS, **_job_view(job)
        )
        return render(request, "console/pool_job.html", context, status=status)
    return _pool_page(request, project, status=status, generate_form=form, job=job)


@login_required
@require_GET
def pool_job_live(request: HttpRequest, project_id: int, generation_job_id: int) -> HttpResponse:
    """Return one generation job's status and progress (htmx polls it until it ends)."""
    project = console_project(user=request.user, project_id=project_id)
    job = get_object_or_404(
        GenerationJob.objects.select_related("round"), project=project, pk=generation_job_id
    )
    view = _job_view(job)
    context = console_context(request=request, project=project, poll_seconds=POLL_SECONDS, **view)
    status = 200 if view["active"] else HTMX_STOP_POLLING
    return render(request, "console/pool_job.html", context, status=status)
