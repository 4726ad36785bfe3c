"""Server-rendered annotator pages: project list, task page, htmx partials for next and skip.

Everything shown is blind: the item comes from `selectors.assignment_payload` (no model,
checkpoint, gold flag or assignment kind) and model/user text is rendered through a safe
Markdown subset (raw HTML escaped, then sanitised by nh3). Judgments are posted by
`static/js/annotate/main.js` to the JSON API (`/api/assignments/{id}/submit/`) with an idempotency
key, so a retried submit never records twice.
"""

import json

import nh3
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from markdown_it import MarkdownIt

from annotation import errors, selectors, services
from annotation.models import Assignment, Membership, Project, TaskKind
from annotation.web_selectors import annotator_project_list, membership_pause_notice

# Raw HTML in the source is escaped as text (html=False); images become the text
# "[image: alt]", so no remote image is ever fetched; markdown-it already refuses
# javascript:/vbscript:/data: links.
_MARKDOWN = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False}).enable(
    ["table", "strikethrough"]
)


def _image_as_text(renderer, tokens, idx, options, env) -> str:
    alt = renderer.renderInlineAsText(tokens[idx].children or [], options, env)
    return escape(f"[image: {alt}]")


_MARKDOWN.add_render_rule("image", _image_as_text)
# Defence in depth on the rendered HTML: a closed list of tags, no style, no event handlers.
_SAFE_TAGS = (
    {"p", "br", "pre", "code", "blockquote", "hr", "ul", "ol", "li"}
    | {"em", "strong", "del", "s", "a"}
    | {"h1", "h2", "h3", "h4", "h5", "h6"}
    | {"table", "thead", "tbody", "tr", "th", "td"}
)
_CLEANER = nh3.Cleaner(
    tags=_SAFE_TAGS,
    attributes={"a": {"href", "title"}, "ol": {"start"}},
    url_schemes={"http", "https", "mailto"},
    link_rel="noopener noreferrer nofollow",
    set_tag_attribute_values={"a": {"target": "_blank"}},
    strip_comments=True,
)

ROLE_LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
# value -> (label, keys shown, aria-keyshortcuts)
CHOICE_LABELS = {
    "A": ("A is better", "1 / A", "1 A"),
    "B": ("B is better", "2 / B", "2 B"),
    "tie": ("Tie", "T", "T"),
    "both_bad": ("Both bad", "X", "X"),
}
SKIP_REASONS = [
    ("expertise", "Outside my expertise"),
    ("unreadable", "Text is broken or unreadable"),
    ("harmful", "Harmful or upsetting content"),
    ("other", "Other (say why)"),
]
CONFIDENCE_LEVELS = [
    (1, "Guess"),
    (2, "Unsure"),
    (3, "Fairly sure"),
    (4, "Sure"),
    (5, "Certain"),
]
PREVIEW_CHARS = 160
_NOTICE_TITLES = {"skip_budget": "No more skips for now"}


def render_untrusted(text: str) -> SafeString:
    """Return model or user text as sanitised HTML from a safe Markdown subset."""
    return mark_safe(_CLEANER.clean(_MARKDOWN.render(text or "")))


def _is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def _membership_or_404(*, project_id: int, user) -> Membership:
    membership = selectors.membership_get(project_id=project_id, user=user)
    if membership is None:
        raise Http404("No such project.")
    return membership


def _turns(prompt: dict) -> list[dict]:
    messages = prompt.get("messages")
    if not messages:
        return [{"label": "User", "role": "user", "html": render_untrusted(prompt.get("text"))}]
    turns = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "user")
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False, indent=2)
        turns.append(
            {
                "label": ROLE_LABELS.get(role, role[:40].title()),
                "role": role if role in ROLE_LABELS else "other",
                "html": render_untrusted(content),
            }
        )
    return turns


def _preview(text: str) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def _item_context(*, assignment: Assignment, project: Project) -> dict:
    payload = selectors.assignment_payload(assignment=assignment)
    options = selectors.project_options(project)
    return {
        "assignment_id": payload["assignment_id"],
        "turns": _turns(payload["prompt"]),
        "candidates": [
            {
                "slot": candidate["slot"],
                "index": index,
                "html": render_untrusted(candidate["text"]),
                "preview": _preview(candidate["text"]),
            }
            for index, candidate in enumerate(payload["candidates"])
        ],
        "choices": [
            {
                "value": value,
                "label": CHOICE_LABELS[value][0],
                "keys": CHOICE_LABELS[value][1],
                "shortcuts": CHOICE_LABELS[value][2],
            }
            for value in options["choices"]
        ],
        "skip_reasons": SKIP_REASONS,
        "confidence_levels": CONFIDENCE_LEVELS,
    }


def _task_context(*, request: HttpRequest, membership: Membership) -> dict:
    """Serve the annotator's live item (or claim the next) and build what the page shows."""
    project = membership.project
    context = {
        "project": project,
        "options": selectors.project_options(project),
        "is_pairwise": project.task_kind == TaskKind.PAIRWISE,
        "last_slot": selectors.SLOT_LABELS[project.k - 1],
        # G toggles the guidelines; from seven cards on, G is also a card's letter.
        "guidelines_key": (
            "Shift+G" if project.task_kind == TaskKind.RANKING and project.k >= 7 else "G"
        ),
    }
    try:
        assignment = services.assignment_next(project_id=project.pk, user=request.user)
    except errors.NotFound:
        raise Http404("No such project.") from None
    except errors.ServiceError as exc:
        # Paused by QC, or too many skips (429 skip_budget): say why in place of the item.
        if exc.code == "paused":
            membership.refresh_from_db(fields=["status", "status_reason"])
            context["notice"] = membership_pause_notice(membership=membership)
        else:
            context["notice"] = {"title": _NOTICE_TITLES.get(exc.code), "message": exc.message}
    else:
        if assignment is None:
            context["done"] = True
        else:
            context.update(_item_context(assignment=assignment, project=project))
    context["progress"] = selectors.project_progress(project=project, user=request.user)
    return context


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """List the annotator's projects with their progress."""
    return render(
        request, "annotation/home.html", {"rows": annotator_project_list(user=request.user)}
    )


@login_required
@require_GET
def task(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the task page with the annotator's current item (claimed if they have none)."""
    membership = _membership_or_404(project_id=project_id, user=request.user)
    context = _task_context(request=request, membership=membership)
    context["rubric_html"] = render_untrusted(membership.project.rubric)
    return render(request, "annotation/task.html", context)


@login_required
@require_POST
def task_next(request: HttpRequest, project_id: int) -> HttpResponse:
    """Return the next item as an htmx partial (the page itself without htmx)."""
    membership = _membership_or_404(project_id=project_id, user=request.user)
    if not _is_htmx(request):
        return redirect("annotate-task", project_id=project_id)
    context = _task_context(request=request, membership=membership)
    return render(request, "annotation/_item.html", {**context, "oob": True})


@login_required
@require_POST
def task_skip(request: HttpRequest, project_id: int, assignment_id: int) -> HttpResponse:
    """Skip the item with a reason, then answer with the next one."""
    membership = _membership_or_404(project_id=project_id, user=request.user)
    code = request.POST.get("reason", "")
    other = request.POST.get("reason_other", "").strip()
    labels = dict(SKIP_REASONS)
    reason = other if code == "other" else labels.get(code, "")
    if code != "other" and other:
        reason = f"{reason}: {other}"
    skip_error = ""
    try:
        services.assignment_skip(assignment_id=assignment_id, user=request.user, reason=reason)
    except errors.NotFound:
        raise Http404("No such assignment.") from None
    except errors.Conflict:
        pass  # Already submitted or expired: there is nothing to skip, move on.
    except errors.ServiceError as exc:
        skip_error = exc.message
    if not _is_htmx(request):
        return redirect("annotate-task", project_id=project_id)
    context = _task_context(request=request, membership=membership)
    context.update(oob=True, skip_error=skip_error)
    return render(request, "annotation/_item.html", context)
