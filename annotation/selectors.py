"""Read-side queries: what a caller may see, and the blind payload served to annotators."""

import math

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Q, Sum

from annotation import sql
from annotation.access import user_can_review
from annotation.models import (
    Assignment,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
    TaskKind,
)
from annotation.serving import payload_sql

SLOT_LABELS = "ABCDEFGH"
# How long annotators see the same project totals (see `project_progress`).
PROGRESS_SNAPSHOT_SECONDS = 300


def membership_get(*, project_id: int, user) -> Membership | None:
    """Return the user's membership in a project still served (not archived), or None."""
    return (
        Membership.objects.select_related("project")
        .filter(project_id=project_id, user=user, project__archived=False)
        .first()
    )


def project_options(project: Project) -> dict:
    """Return which answers and extras the project asks for (safe to show annotators)."""
    choices = ["A", "B"]
    if project.allow_tie:
        choices.append("tie")
    if project.allow_both_bad and project.task_kind == TaskKind.PAIRWISE:
        choices.append("both_bad")
    return {
        "task_kind": project.task_kind,
        "k": project.k,
        "choices": choices if project.task_kind == TaskKind.PAIRWISE else [],
        "allow_tied_ranks": project.task_kind == TaskKind.RANKING and project.allow_tie,
        "ask_strength": project.ask_strength,
        "ask_confidence": project.ask_confidence,
        "ask_rationale": project.ask_rationale,
    }


def assignment_payload(*, assignment: Assignment) -> dict:
    """Return what an annotator sees for an assignment: no model, checkpoint, gold or kind.

    The rows come with the assignment when its claim read them in the same statement
    (`annotation.serving`), else from one read here.
    """
    rows = getattr(assignment, "payload_rows", None)
    if rows is None:
        rows = sql.fetch_all(payload_sql("%s"), [assignment.item_id])
    by_position = {position: text for position, text, _, _ in rows}
    prompt_text, messages = (rows[0][2], rows[0][3]) if rows else ("", None)
    if messages is not None:
        messages = Prompt._meta.get_field("messages").from_db_value(messages, None, connection)
    return {
        "assignment_id": assignment.pk,
        "project_id": assignment.project_id,
        "lease_expires": assignment.lease_expires.isoformat(),
        "prompt": {"text": prompt_text, "messages": messages},
        "candidates": [
            {"slot": SLOT_LABELS[i], "text": by_position[position]}
            for i, position in enumerate(assignment.display_order)
        ],
    }


def project_progress(*, project: Project, user) -> dict:
    """Return project totals, and the caller's own count of judgments.

    Reviewers and researchers read the live totals. Annotators read a snapshot of them in
    whole percent, refreshed at most every `PROGRESS_SNAPSHOT_SECONDS`, and their own count
    of judgments of every kind: were the live totals shown, whether they moved after a
    submit would tell primary items from gold and repeats (which fill no item).
    """
    mine = Judgment.objects.filter(project=project, annotator=user).count()
    if user_can_review(project_id=project.pk, user=user):
        return {**_progress_totals(project), "my_judgments": mine}
    key = f"prefloop:progress-snapshot:{project.pk}"
    snapshot = cache.get(key)
    if snapshot is None:
        snapshot = _progress_coarse(_progress_totals(project))
        cache.set(key, snapshot, PROGRESS_SNAPSHOT_SECONDS)
    return {**snapshot, "my_judgments": mine}


def _progress_totals(project: Project) -> dict:
    rounds = Round.objects.filter(project=project)
    open_round_ids = list(rounds.filter(status=Round.Status.OPEN).values_list("id", flat=True))
    items = project.items.filter(round_id__in=open_round_ids, is_gold=False)
    totals = items.aggregate(
        n_items=Count("id"),
        n_complete=Count("id", filter=Q(n_done__gte=project.overlap)),
        n_done=Sum("n_done"),
    )
    needed = (totals["n_items"] or 0) * project.overlap
    done = min(totals["n_done"] or 0, needed)
    return {
        "project_id": project.pk,
        "open_rounds": len(open_round_ids),
        "items": totals["n_items"] or 0,
        "items_complete": totals["n_complete"] or 0,
        "judgments_needed": needed,
        "judgments_done": done,
        "fraction_complete": (done / needed) if needed else 0.0,
    }


def _progress_coarse(totals: dict) -> dict:
    """Return the totals in whole percent (rounded down); the counts follow those shares."""
    fraction = math.floor(totals["fraction_complete"] * 100) / 100
    share_complete = totals["items_complete"] / totals["items"] if totals["items"] else 0.0
    return {
        **totals,
        "items_complete": round(math.floor(share_complete * 100) / 100 * totals["items"]),
        "judgments_done": round(fraction * totals["judgments_needed"]),
        "fraction_complete": fraction,
    }
