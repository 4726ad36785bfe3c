"""What every console page shows around its content: the project and the navigation."""

from __future__ import annotations

from django.urls import NoReverseMatch, reverse

from annotation import access
from annotation.models import Project


def project_page_url(name: str, project_id: int) -> str | None:
    """Return a console page of a project, or None while it is not routed."""
    try:
        return reverse(f"console:{name}", args=[project_id])
    except NoReverseMatch:
        return None


def training_url(project_id: int) -> str | None:
    """Return the console's training page of a project, or None while it is not routed."""
    return project_page_url("training", project_id)


def console_context(*, request, project: Project | None = None, section: str = "", **extra):
    """Return the template context of a console page: navigation links for this user."""
    nav = [("projects", "Projects", reverse("console:projects"))]
    if project is not None:
        can_manage = access.user_can_manage(project_id=project.pk, user=request.user)
        if can_manage:
            nav.append(("data", "Data", reverse("console:data", args=[project.pk])))
        nav.append(("review", "Review", reverse("console:review", args=[project.pk])))
        if can_manage:
            for name, label in (
                ("pool", "Prompts"),
                ("models", "Models"),
                ("training", "Training"),
                ("loop", "Loop"),
            ):
                url = project_page_url(name, project.pk)
                if url is not None:
                    nav.append((name, label, url))
        if can_manage:
            nav.append(("dashboard", "Dashboard", reverse("dashboard:project", args=[project.pk])))
    else:
        nav.append(("dashboard", "Dashboard", reverse("dashboard:home")))
    return {"project": project, "section": section, "nav": nav, **extra}
