"""Read-side queries for the annotator web pages (blind: no model, checkpoint, gold or kind)."""

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
                "options": project_options(project),
                "progress": project_progress(project=project, user=user),
            }
        )
    return rows
