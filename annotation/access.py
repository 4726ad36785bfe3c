"""Who may see and do what in a project: the one access check of every app's views and services.

A project is *visible* to staff and to its members, except that an archived project is hidden
from members who only annotate. Within a visible project, ``role`` asks for more: reviewers
(and researchers) read other people's labels, researchers change the project. Staff may do
everything. An invisible project answers NotFound, as if it did not exist; a visible one the
caller's role does not reach answers Forbidden.
"""

from django.db.models import Q, QuerySet

from annotation.errors import Forbidden, NotFound
from annotation.models import Membership, Project

MEMBER = "member"
REVIEWER = "reviewer"
MANAGER = "manager"

_ROLES_ALLOWED = {
    REVIEWER: (Membership.Role.RESEARCHER, Membership.Role.REVIEWER),
    MANAGER: (Membership.Role.RESEARCHER,),
}
_REFUSALS = {
    REVIEWER: "Only the project's reviewers and researchers may do this.",
    MANAGER: "Only the project's researchers may do this.",
}


def project_list_for_user(*, user) -> QuerySet[Project]:
    """Return the projects a user may see: all for staff, their memberships otherwise."""
    if user.is_staff:
        return Project.objects.all()
    # Archived projects stay readable to the members who read labels, not to annotators.
    # One filter() call: both conditions hold for the same membership row.
    return Project.objects.filter(
        Q(archived=False)
        | Q(memberships__role__in=[Membership.Role.RESEARCHER, Membership.Role.REVIEWER]),
        memberships__user=user,
    ).distinct()


def user_can_manage(*, project_id: int, user) -> bool:
    """Return whether the user may change the project (staff or a researcher in it)."""
    return _has_role(project_id=project_id, user=user, role=MANAGER)


def user_can_review(*, project_id: int, user) -> bool:
    """Return whether the user may read other people's labels (staff, researcher, reviewer)."""
    return _has_role(project_id=project_id, user=user, role=REVIEWER)


def project_for(*, user, project_id: int, role: str = MEMBER) -> Project:
    """Return the project if the user may act in it as `role`; raise NotFound or Forbidden."""
    if role not in (MEMBER, *_ROLES_ALLOWED):
        raise ValueError(f"unknown role {role!r}")
    project = project_list_for_user(user=user).filter(pk=project_id).first()
    if project is None:
        raise NotFound("No such project.")
    if role != MEMBER and not _has_role(project_id=project.pk, user=user, role=role):
        raise Forbidden(_REFUSALS[role])
    return project


def _has_role(*, project_id: int, user, role: str) -> bool:
    if user.is_staff:
        return True
    return Membership.objects.filter(
        project_id=project_id, user=user, role__in=_ROLES_ALLOWED[role]
    ).exists()
