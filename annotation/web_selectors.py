"""Read-side queries for the annotator web pages (blind: no model, checkpoint, gold or kind)."""

from django.conf import settings

from annotation.models import Membership, TaskKind
from annotation.selectors import project_options, project_progress


def annotator_project_list(*, user) -> list[dict]:
    """Return the projects the user annotates in, with their options and progress."""
    memberships = (
        Membership.objects.filter(user=user, project__archived=False)
        .select_related("project")
        .order_by("project__name")
    )
    rows = []
    for membership in memberships:
        project = membership.project
        rows.append(
            {
                "project": project,
                "kind_label": (
                    "Pairwise (A/B)"
                    if project.task_kind == TaskKind.PAIRWISE
                    else f"Rank {project.k} responses"
                ),
                "paused": membership.status != Membership.Status.ACTIVE,
                "pause_reason": membership.status_reason,
                "options": project_options(project),
                "progress": project_progress(project=project, user=user),
            }
        )
    return rows


def _contact_link(contact: str) -> dict:
    if contact.startswith(("https://", "http://")):
        return {"label": contact, "href": contact}
    if "@" in contact and " " not in contact:
        return {"label": contact, "href": f"mailto:{contact}"}
    return {"label": contact, "href": ""}


def membership_pause_notice(*, membership: Membership) -> dict:
    """Return why the annotator is paused in this project and whom they can ask."""
    researchers = (
        Membership.objects.filter(project_id=membership.project_id, role=Membership.Role.RESEARCHER)
        .select_related("user")
        .order_by("user__username")
    )
    contacts = []
    configured = settings.PREFLOOP_ANNOTATOR_CONTACT.strip()
    if configured:
        contacts.append(_contact_link(configured))
    for row in researchers:
        user = row.user
        email = user.email.strip()
        contacts.append(
            {
                "label": user.get_full_name() or user.get_username(),
                "href": f"mailto:{email}" if email else "",
                "email": email,
            }
        )
    return {
        "paused": True,
        "title": "Your annotation in this project is paused",
        "message": "You cannot take new items here until a researcher resumes you.",
        "reason": membership.status_reason,
        "contacts": contacts,
    }
