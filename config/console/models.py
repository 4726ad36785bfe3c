"""Console pages of a project's models: the registry with validation status, uploads, folders.

Only the project's researchers and staff reach them (`config.console.access`). Every form calls
the same service as the API (`training.registry`), so the page refuses what the API refuses,
with the field named, and keeps nothing when it refuses. Registering a folder is staff's; a
researcher uploads an archive or names a version one of the project's runs produced. The
table is an htmx partial polled while a version waits for or undergoes validation; once none
does it answers 286, which tells htmx to stop polling.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from annotation.errors import ServiceError
from annotation.models import Project
from config.console.access import console_project
from config.console.context import console_context
from training import config_policy, registry, registry_uploads, selectors
from training.models import ModelVersion

POLL_SECONDS = 3
HTMX_STOP_POLLING = 286
ACTIVE = (ModelVersion.Status.PENDING, ModelVersion.Status.VALIDATING)
KIND_CHOICES = [(kind.value, kind.label) for kind in registry.WEIGHT_KINDS]
PROMPT_FORMAT_LABELS = {"chat_template": "Its chat template", "plain": "Plain text"}
PROMPT_FORMAT_CHOICES = [(key, PROMPT_FORMAT_LABELS[key]) for key in registry.PROMPT_FORMATS]
PROMPT_FORMAT_HELP = " ".join(
    f"{PROMPT_FORMAT_LABELS[key]}: {text}." for key, text in registry.PROMPT_FORMATS.items()
)


class _RegistrationForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Unique: letters, digits, '.', '_' or '-'.")
    kind = forms.ChoiceField(
        choices=KIND_CHOICES,
        help_text="Policy: a causal language model. Reward model: a classifier with one output.",
    )
    prompt_format = forms.ChoiceField(
        choices=PROMPT_FORMAT_CHOICES,
        initial=registry.DEFAULT_PROMPT_FORMAT,
        help_text=f"How prompts are laid out for the model. {PROMPT_FORMAT_HELP}",
    )


class UploadForm(_RegistrationForm):
    file = forms.FileField(
        help_text="A .tar.gz, .tgz, .tar or .zip of a transformers folder (config.json, "
        "weights, tokenizer). No links; it is unpacked into this project's own folder."
    )


class FolderForm(_RegistrationForm):
    path = forms.CharField(
        max_length=1000,
        help_text="Absolute folder under the artefact root or PREFLOOP_MODEL_ROOTS (staff only).",
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", "folder_%s")  # beside the upload form: ids stay unique
        super().__init__(*args, **kwargs)


class RegisterForm(forms.Form):
    name = forms.CharField(max_length=200)
    prompt_format = forms.ChoiceField(
        choices=PROMPT_FORMAT_CHOICES, initial=registry.DEFAULT_PROMPT_FORMAT
    )


def _project(request: HttpRequest, project_id: int) -> Project:
    return console_project(user=request.user, project_id=project_id)


def _versions(project: Project):
    return selectors.model_version_list_for_project(project_id=project.pk)


def _version(project: Project, version_id: int) -> ModelVersion:
    version = _versions(project).filter(pk=version_id).first()
    if version is None:
        raise Http404("No such model version in this project.")
    return version


def _version_view(version: ModelVersion) -> dict:
    """Return what the table shows of a version: figures, short hashes, the reason it failed."""
    record = version.validation or {}
    hashes = record.get("hashes") or {}
    return {
        "version": version,
        "parameters": record.get("parameters"),
        "dtype": record.get("dtype", ""),
        "architecture": record.get("architecture", ""),
        "prompt_format": record.get("prompt_format", ""),
        "hashes": [
            (label, (hashes.get(key) or "")[:12], hashes.get(key) or "")
            for key, label in (
                ("weights", "weights"),
                ("tokenizer", "tokenizer"),
                ("chat_template", "template"),
            )
            if hashes.get(key)
        ],
        "error": config_policy.paths_redact(version.validation_error, keep=version.artifact_path),
        "active": version.status in ACTIVE,
        "can_register": version.source == ModelVersion.Source.RUN
        and version.training_run_id is not None
        and version.status != ModelVersion.Status.VALIDATING,
        "can_validate": version.kind != ModelVersion.Kind.ENDPOINT
        and version.status != ModelVersion.Status.VALIDATING,
        "register_form": RegisterForm(
            initial={
                "name": version.name,
                "prompt_format": record.get("prompt_format", registry.DEFAULT_PROMPT_FORMAT),
            },
            prefix=f"v{version.pk}",
        ),
    }


def _table_context(project: Project) -> dict:
    rows = [_version_view(version) for version in _versions(project)]
    return {"rows": rows, "polling": any(row["active"] for row in rows)}


def _page(
    request: HttpRequest,
    project: Project,
    *,
    upload_form: UploadForm | None = None,
    folder_form: FolderForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context = console_context(
        request=request,
        project=project,
        section="models",
        poll_seconds=POLL_SECONDS,
        upload_form=upload_form or UploadForm(),
        folder_form=(folder_form or FolderForm()) if request.user.is_staff else None,
        **_table_context(project),
    )
    return render(request, "console/models.html", context, status=status)


def _add_error(form: forms.Form, exc: ServiceError) -> None:
    field = getattr(exc, "field", "")
    message = exc.message.removeprefix(f"{field}: ") if field else exc.message
    form.add_error(field if field in form.fields else None, message)


@login_required
@require_GET
def models_home(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the project's model versions, the upload form, and the folder form for staff."""
    return _page(request, _project(request, project_id))


@login_required
@require_GET
def models_table(request: HttpRequest, project_id: int) -> HttpResponse:
    """Return the versions table alone (htmx polls it while a version is being validated)."""
    project = _project(request, project_id)
    context = console_context(
        request=request,
        project=project,
        section="models",
        poll_seconds=POLL_SECONDS,
        **_table_context(project),
    )
    status = 200 if context["polling"] else HTMX_STOP_POLLING
    return render(request, "console/models_table.html", context, status=status)


@login_required
@require_POST
def models_upload(request: HttpRequest, project_id: int) -> HttpResponse:
    """Unpack an uploaded archive into the project's folder and queue its validation."""
    project = _project(request, project_id)
    try:  # before the body is read
        registry_uploads.upload_declared_size_check(
            content_length=request.META.get("CONTENT_LENGTH")
        )
    except ServiceError as exc:
        messages.error(request, exc.message)
        return _page(request, project, status=exc.status)
    form = UploadForm(request.POST, request.FILES)
    status = 400
    if form.is_valid():
        data = form.cleaned_data
        try:
            version = registry_uploads.model_version_upload(
                project=project,
                name=data["name"],
                kind=data["kind"],
                upload=data["file"],
                prompt_format=data["prompt_format"],
            )
        except ServiceError as exc:
            _add_error(form, exc)
            status = exc.status
        else:
            messages.success(request, f"{version.name} uploaded; it is being validated.")
            return redirect("console:models", project.pk)
    return _page(request, project, upload_form=form, status=status)


@login_required
@require_POST
def models_folder(request: HttpRequest, project_id: int) -> HttpResponse:
    """Register a folder under the model roots for this project (staff only)."""
    project = _project(request, project_id)
    if not request.user.is_staff:
        raise PermissionDenied("Only staff may register a folder; upload an archive instead.")
    form = FolderForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            version = registry.model_version_register_folder(
                name=data["name"],
                kind=data["kind"],
                path=data["path"],
                project=project,
                prompt_format=data["prompt_format"],
            )
        except ServiceError as exc:
            _add_error(form, exc)
        else:
            messages.success(request, f"{version.name} registered; it is being validated.")
            return redirect("console:models", project.pk)
    return _page(request, project, folder_form=form, status=400)


@login_required
@require_POST
def models_register(request: HttpRequest, project_id: int, version_id: int) -> HttpResponse:
    """Name a version one of the project's runs produced, and validate it."""
    project = _project(request, project_id)
    version = _version(project, version_id)
    form = RegisterForm(request.POST, prefix=f"v{version.pk}")
    if not form.is_valid():
        problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        messages.error(request, f"{version.name} was not registered: {problems}")
        return redirect("console:models", project.pk)
    try:
        version = registry.model_version_register_run(
            version=version,
            name=form.cleaned_data["name"],
            prompt_format=form.cleaned_data["prompt_format"],
        )
    except ServiceError as exc:
        messages.error(request, f"{version.name} was not registered: {exc.message}")
    else:
        messages.success(request, f"{version.name} registered; it is being validated.")
    return redirect("console:models", project.pk)


@login_required
@require_POST
def models_validate(request: HttpRequest, project_id: int, version_id: int) -> HttpResponse:
    """Validate a version again (e.g. after its folder was fixed)."""
    project = _project(request, project_id)
    version = _version(project, version_id)
    try:
        registry.model_version_revalidate(version=version)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{version.name} is being validated again.")
    return redirect("console:models", project.pk)
