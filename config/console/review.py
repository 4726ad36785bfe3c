"""Console page for reviewers: the disputed-items queue and a verdict form per item.

Each item shows its answers in canonical order (A = position 0, as verdicts are stored), every
label with its annotator and that annotator's trust (the Laplace-smoothed gold accuracy the
trust-weighted export uses), and a verdict form that goes through `adjudication_create`.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from annotation import access
from annotation.errors import ServiceError
from annotation.models import Item
from annotation.views import render_untrusted
from config.console.access import console_project
from config.console.context import console_context
from config.console.forms import VerdictForm
from evaluation import selectors as qc_selectors
from evaluation import services as qc_services

QUEUE_PAGE = 20
RANK_WORDS = "ABCDEFGH"


def _label_text(label: dict) -> str:
    if label["ranking"]:
        order = sorted(range(len(label["ranking"])), key=lambda i: label["ranking"][i])
        return " > ".join(RANK_WORDS[i] for i in order)
    return {"tie": "Tie", "both_bad": "Both bad"}.get(label["choice"], f"{label['choice']} better")


def _entries(project, queue: list[dict], forms: dict[int, VerdictForm]) -> list[dict]:
    trust = {
        row["username"]: row["trust_weight"]
        for row in qc_selectors.annotator_quality_table(project=project)
    }
    entries = []
    for entry in queue:
        prompt = entry["prompt"]
        turns = prompt["messages"] or [{"role": "user", "content": prompt["text"]}]
        entries.append(
            {
                **entry,
                "turns": [(t["role"], render_untrusted(t["content"])) for t in turns],
                "answers": [(c["label"], render_untrusted(c["text"])) for c in entry["candidates"]],
                "rows": [
                    {**label, "text": _label_text(label), "trust": trust.get(label["annotator"])}
                    for label in entry["labels"]
                ],
                "form": forms.get(entry["item_id"]) or VerdictForm(project=project),
            }
        )
    return entries


def _review_page(request, project, *, status=200, refused_item=None, form=None) -> HttpResponse:
    queue = qc_selectors.disagreement_queue(project=project, limit=QUEUE_PAGE)
    results = queue["results"]
    forms = {}
    if refused_item is not None:
        forms[refused_item.pk] = form
        if all(entry["item_id"] != refused_item.pk for entry in results):
            # The refused verdict's item stays on the page, with its errors, even off the queue.
            results = [qc_selectors.review_item(item=refused_item), *results]
    context = console_context(
        request=request,
        project=project,
        section="review",
        count=queue["count"],
        entries=_entries(project, results, forms),
    )
    return render(request, "console/review.html", context, status=status)


@login_required
@require_GET
def review_queue(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the disputed items, most split first."""
    project = console_project(user=request.user, project_id=project_id, role=access.REVIEWER)
    return _review_page(request, project)


@login_required
@require_POST
def review_refresh(request: HttpRequest, project_id: int) -> HttpResponse:
    """Queue the items now split beyond the QC policy's threshold (as QC checks do)."""
    project = console_project(user=request.user, project_id=project_id, role=access.REVIEWER)
    qc_services.disagreements_mark(project=project)
    return redirect("console:review", project.pk)


@login_required
@require_POST
def verdict_create(request: HttpRequest, project_id: int, item_id: int) -> HttpResponse:
    """Store a verdict on a disputed item through `adjudication_create`."""
    project = console_project(user=request.user, project_id=project_id, role=access.REVIEWER)
    item = Item.objects.filter(project=project, pk=item_id).first()
    if item is None:
        raise Http404("No such item in this project.")
    form = VerdictForm(request.POST, project=project)
    if form.is_valid():
        try:
            qc_services.adjudication_create(
                item_id=item.pk,
                reviewer=request.user,
                note=form.cleaned_data["note"],
                **form.label(),
            )
        except ServiceError as exc:
            field = exc.code if exc.code in form.fields else None
            if exc.code == "ranking":
                field = "rank_0"
            form.add_error(field, exc.message)
        else:
            return redirect("console:review", project.pk)
    return _review_page(request, project, status=400, refused_item=item, form=form)
