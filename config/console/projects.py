"""Console pages for projects: list, create, archive, members (add, role, pause, resume).

Pages answer as `config.console.access` says (404 outside one's projects, 403 for a role that
does not reach, login for anonymous users). Writes go through the services the API uses.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from annotation import access, accounts, projects, selectors, services
from annotation.errors import ServiceError
from annotation.models import Membership
from config.console.access import console_allowed, console_project, console_projects
from config.console.context import console_context
from config.console.forms import MemberForm, PauseForm, ProjectForm, ResumeForm, add_errors
from evaluation import selectors as qc_selectors
from evaluation import services as qc_services

AGREEMENT_SECONDS = 10


@login_required
@require_GET
def project_list(request: HttpRequest) -> HttpResponse:
    """List the projects the user runs or reviews, archived ones marked."""
    if not console_allowed(user=request.user):
        raise PermissionDenied("The console is for researchers, reviewers and staff.")
    rows = list(console_projects(user=request.user).order_by("archived", "name"))
    manageable = {
        row.pk for row in rows if access.user_can_manage(project_id=row.pk, user=request.user)
    }
    context = console_context(
        request=request, section="projects", projects=rows, manageable=manageable
    )
    return render(request, "console/projects.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def project_new(request: HttpRequest) -> HttpResponse:
    """Create a project with every setting (staff only, as the API allows)."""
    if not request.user.is_staff:
        raise PermissionDenied("Only staff may create projects.")
    form = ProjectForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        settings = {name: form.cleaned_data[name] for name in projects.PROJECT_SETTINGS}
        try:
            project = projects.project_create(settings=settings, researcher=request.user)
        except projects.ProjectInvalid as exc:
            add_errors(form, exc.problems)
        else:
            return redirect("console:project", project.pk)
    status = 400 if request.method == "POST" else 200
    context = console_context(request=request, section="projects", form=form)
    return render(request, "console/project_new.html", context, status=status)


def _project_page(request, project, *, status=200, **forms) -> HttpResponse:
    context = console_context(
        request=request,
        project=project,
        section="projects",
        member_form=forms.get("member_form") or MemberForm(),
        refused=forms.get("refused"),
        refused_user=forms.get("refused_user"),
        settings=[
            (field.verbose_name, getattr(project, field.name), field.help_text)
            for field in (project._meta.get_field(n) for n in projects.PROJECT_SETTINGS)
        ],
        **_live(project, request.user),
    )
    return render(request, "console/project.html", context, status=status)


def _live(project, user) -> dict:
    """Return what the project page refreshes: progress, agreement, members and QC state."""
    progress = selectors.project_progress(project=project, user=user)
    return {
        "progress": progress,
        "agreement": _agreement_headline(project),
        "members": qc_selectors.annotator_quality_table(project=project),
        "disputed": project.items.filter(needs_review=True).count(),
    }


def _agreement_headline(project) -> dict:
    """Return the human labels' agreement, recomputed at most every AGREEMENT_SECONDS.

    The page polls every few seconds and every open page would otherwise read all labels
    each time; no bootstrap here (the dashboard shows the intervals).
    """
    key = f"prefloop:console-agreement:{project.pk}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    report = qc_selectors.project_agreement(project=project, n_boot=0)
    human = report["by_source"].get("human") or {}
    headline = human.get("alpha") or human.get("kendall_tau")
    result = {
        "alpha": None if headline is None else headline["estimate"],
        "n_items": human.get("n_items", 0),
        "n_judgments": human.get("n_judgments", 0),
    }
    cache.set(key, result, AGREEMENT_SECONDS)
    return result


@login_required
@require_GET
def project_detail(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show a project: settings, progress, agreement, members with their QC state."""
    project = console_project(user=request.user, project_id=project_id)
    return _project_page(request, project)


@login_required
@require_GET
def project_live(request: HttpRequest, project_id: int) -> HttpResponse:
    """Return the live part of the project page (polled by htmx)."""
    project = console_project(user=request.user, project_id=project_id)
    context = console_context(request=request, project=project, **_live(project, request.user))
    return render(request, "console/_live.html", context)


@login_required
@require_POST
def project_archive(request: HttpRequest, project_id: int) -> HttpResponse:
    """Archive a project (or bring it back): annotators no longer see or get its items."""
    project = console_project(user=request.user, project_id=project_id)
    archived = request.POST.get("archived")
    if archived not in ("0", "1"):
        return _project_page(
            request, project, status=400, refused="archived: send 1 to archive, 0 to restore."
        )
    accounts.project_archive(project=project, archived=archived == "1")
    return redirect("console:project", project.pk)


@login_required
@require_POST
def member_add(request: HttpRequest, project_id: int) -> HttpResponse:
    """Add a member by username with a role, or change their role."""
    project = console_project(user=request.user, project_id=project_id)
    form = MemberForm(request.POST)
    if not form.is_valid():
        return _project_page(request, project, status=400, member_form=form)
    services.membership_set(project=project, user=form.user, role=form.cleaned_data["role"])
    return redirect("console:project", project.pk)


def _member(project, user_id: int) -> Membership:
    membership = Membership.objects.filter(project=project, user_id=user_id).first()
    if membership is None:
        raise Http404("No such member of this project.")
    return membership


@login_required
@require_POST
def member_pause(request: HttpRequest, project_id: int, user_id: int) -> HttpResponse:
    """Pause an annotator with a reason they are shown; the QC record keeps it."""
    project = console_project(user=request.user, project_id=project_id)
    membership = _member(project, user_id)
    form = PauseForm(request.POST)
    refused = None
    if form.is_valid():
        try:
            qc_services.annotator_pause_manual(
                project=project,
                annotator_id=membership.user_id,
                by=request.user,
                reason=form.cleaned_data["reason"],
            )
        except ServiceError as exc:
            refused = f"{exc.code}: {exc.message}"
    else:
        refused = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
    if refused:
        return _project_page(
            request, project, status=400, refused=refused, refused_user=membership.user_id
        )
    return redirect("console:project", project.pk)


@login_required
@require_POST
def member_resume(request: HttpRequest, project_id: int, user_id: int) -> HttpResponse:
    """Resume a paused annotator: clears the pause, the skip budget and (if asked) QC flags."""
    project = console_project(user=request.user, project_id=project_id)
    membership = _member(project, user_id)
    form = ResumeForm(request.POST)
    if not form.is_valid():
        refused = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        return _project_page(
            request, project, status=400, refused=refused, refused_user=membership.user_id
        )
    qc_services.annotator_resume(
        project=project,
        annotator_id=membership.user_id,
        by=request.user,
        note=form.cleaned_data["note"],
        clear_labels=form.cleaned_data["clear_labels"],
    )
    return redirect("console:project", project.pk)
