"""What every console page shows around its content: the project and the navigation."""

from __future__ import annotations

import importlib.util

from django.urls import reverse

from annotation import access
from annotation.models import Project


def training_pages_exist() -> bool:
    """Return whether the console's training pages are installed (config.console.training_urls)."""
    return importlib.util.find_spec("config.console.training_urls") is not None


def console_context(*, request, project: Project | None = None, section: str = "", **extra):
    """Return the template context of a console page: navigation links for this user."""
    nav = [("projects", "Projects", reverse("console:projects"))]
    if project is not None:
        can_manage = access.user_can_manage(project_id=project.pk, user=request.user)
        if can_manage:
            nav.append(("data", "Data", reverse("console:data", args=[project.pk])))
        nav.append(("review", "Review", reverse("console:review", args=[project.pk])))
        if can_manage and training_pages_exist():
            nav.append(("training", "Training", f"/console/projects/{project.pk}/training/"))
        if can_manage:
            nav.append(("dashboard", "Dashboard", reverse("dashboard:project", args=[project.pk])))
    else:
        nav.append(("dashboard", "Dashboard", reverse("dashboard:home")))
    return {"project": project, "section": section, "nav": nav, **extra}
