"""Read-side queries for the annotator web pages (blind: no model, checkpoint, gold or kind)."""

import re

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
                "pause_reason": membership_pause_reason(membership=membership),
                "options": project_options(project),
                "progress": project_progress(project=project, user=user),
            }
        )
    return rows


# How evaluation.services.annotator_pause words a QC pause: this prefix, then the failed
# checks joined by "; ". Checks about the annotator's own pace or clicks are shown as stored;
# the others would tell how many gold or repeated items they met, or how others labelled,
# so they are named without figures. A check not listed here gets the general wording.
QC_PAUSE_PREFIX = "Paused by quality control: "
_QC_SHOWN_AS_STORED = (
    re.compile(r"\d+% of \d+ judgments too fast \(limit \d+%\)"),
    re.compile(r"left answer chosen \d+% of \d+ decisions \(binomial p = [\d.e+-]+\)"),
)
_QC_PLAIN_WORDS = (
    ("gold accuracy", "too many answers differ from the expected answer on check items"),
    ("self-agreement", "answers to items shown twice often differ from each other"),
    ("skipped", "more items skipped than other annotators skip"),
    ("agreed with consensus", "answers agree with other annotators less often than expected"),
)
_QC_GENERAL = "a quality check of your recent answers"


def _qc_check_words(check: str) -> str:
    if any(pattern.fullmatch(check) for pattern in _QC_SHOWN_AS_STORED):
        return check
    for prefix, words in _QC_PLAIN_WORDS:
        if check.startswith(prefix):
            return words
    return _QC_GENERAL


def membership_pause_reason(*, membership: Membership) -> str:
    """Return why the annotator is paused, in words that reveal no hidden item or label."""
    stored = membership.status_reason.strip()
    if not stored.startswith(QC_PAUSE_PREFIX):
        return stored  # written by a researcher for this person, or empty
    checks = [part.strip() for part in stored[len(QC_PAUSE_PREFIX) :].split(";") if part.strip()]
    words = dict.fromkeys(_qc_check_words(check) for check in checks)
    return QC_PAUSE_PREFIX + "; ".join(words or [_QC_GENERAL])


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
        "reason": membership_pause_reason(membership=membership),
        "contacts": contacts,
    }
