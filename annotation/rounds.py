"""Rounds of a project: open the next one, close one."""

from django.db import transaction
from django.utils import timezone

from annotation.models import Project, Round


@transaction.atomic
def round_create(*, project: Project, model_version=None, source_key: str = "") -> Round:
    """Open the project's next round; with a source key, return the round it already made."""
    if source_key:
        existing = Round.objects.filter(project=project, source_key=source_key).first()
        if existing is not None:
            return existing
    Project.objects.select_for_update().filter(pk=project.pk).first()
    last = Round.objects.filter(project=project).order_by("-number").first()
    return Round.objects.create(
        project=project,
        number=(last.number + 1) if last else 1,
        model_version=model_version,
        source_key=source_key,
    )


def round_close(*, round_: Round) -> Round:
    """Stop serving a round's items."""
    round_.status = Round.Status.CLOSED
    round_.closed_at = timezone.now()
    round_.save(update_fields=["status", "closed_at"])
    return round_
