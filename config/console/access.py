"""The console's access rule: `annotation.access.project_for`, answered as web pages answer.

A project the user cannot see is a 404 (as if it did not exist); a visible project their role
does not reach is a 403; anonymous users are sent to the login page by `login_required`.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from annotation import access
from annotation.errors import Forbidden, NotFound
from annotation.models import Membership, Project

CONSOLE_ROLES = (Membership.Role.RESEARCHER, Membership.Role.REVIEWER)


def console_project(*, user, project_id: int, role: str = access.MANAGER) -> Project:
    """Return the project if the user may act in it as `role`; raise Http404 or PermissionDenied."""
    try:
        return access.project_for(user=user, project_id=project_id, role=role)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from exc


def console_projects(*, user) -> QuerySet[Project]:
    """Return the projects shown in the console: all for staff, else where the user reviews."""
    if user.is_staff:
        return Project.objects.all()
    return Project.objects.filter(
        memberships__user=user, memberships__role__in=CONSOLE_ROLES
    ).distinct()


def console_allowed(*, user) -> bool:
    """Return whether the user has any console page: staff, researchers and reviewers."""
    return user.is_staff or Membership.objects.filter(user=user, role__in=CONSOLE_ROLES).exists()
