"""Console page of a project's loop: its timeline with live progress, its actions, its settings.

Only the project's researchers and staff reach it (`config.console.access`: 404 outside one's
projects, 403 for annotators and reviewers). Every action goes through the same services as
the API (`training.loop.control`), so the page refuses what the API refuses, with the field
named, and writes nothing when it refuses. The timeline is an htmx partial polled every few
seconds: a tick can change it at any time (beat, a worker finishing a run).
"""

from __future__ import annotations

import dataclasses
import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from annotation.errors import NotFound, ServiceError
from annotation.exports.policy import AGGREGATIONS
from annotation.models import LabelSource, Project
from config.console.access import console_project
from config.console.context import console_context
from training.loop import HARD_MINING_MODES, control
from training.loop.settings import LoopSettings
from training.loop.timeline import loop_timeline

POLL_SECONDS = 3
CHOICES = {
    "path": [("dpo", "DPO on the preferences"), ("rm_ppo", "Reward model, then PPO")],
    "prompt_source": [("pool", "The project's prompt pool"), ("demo", "Arithmetic demo")],
    "hard_mining": [(mode, mode or "none") for mode in HARD_MINING_MODES],
    "aggregation": [(name, name) for name in AGGREGATIONS],
    "train_rounds": [
        ("all", "Every round so far"),
        ("newest", "The newest round only (iterative DPO)"),
    ],
}


def _keeps_default(spec: dataclasses.Field) -> bool:
    """Return whether a choice left out of a post keeps its default ('' is no choice of it)."""
    return (
        spec.name in CHOICES
        and spec.default is not dataclasses.MISSING
        and "" not in dict(CHOICES[spec.name])
    )


class LoopSettingsForm(forms.Form):
    """One field per `LoopSettings` field (objects as JSON), plus the beat schedule."""

    def __init__(self, *args, initial_settings: dict, every_seconds: int | None, **kwargs):
        super().__init__(*args, **kwargs)
        for spec in dataclasses.fields(LoopSettings):
            help_text = spec.metadata.get("help", "")
            kind = str(spec.type)
            value = initial_settings.get(spec.name)
            if spec.name in CHOICES:
                choices = CHOICES[spec.name]
                if spec.name == "path":
                    choices = [("", "choose…"), *choices]
                # '' is a real choice of hard_mining (none); only path must be chosen.
                field = forms.ChoiceField(choices=choices, required=spec.name == "path")
            elif spec.name == "sources":
                field = forms.MultipleChoiceField(
                    choices=LabelSource.choices, widget=forms.CheckboxSelectMultiple
                )
            elif kind == "bool":
                field = forms.BooleanField(required=False)
            elif kind == "int":
                field = forms.IntegerField()
            elif kind == "float":
                field = forms.FloatField()
            elif kind.startswith("dict"):
                field = forms.CharField(
                    widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                    required=False,
                )
                value = json.dumps(value if value is not None else {}, sort_keys=True)
            else:
                field = forms.CharField(required=False)
            field.help_text = help_text
            field.label = spec.name.replace("_", " ")
            field.initial = value
            self.fields[spec.name] = field
        self.fields["every_seconds"] = forms.IntegerField(
            required=False,
            label="tick every (seconds)",
            initial=every_seconds,
            help_text="Advance the loop on a beat schedule; empty leaves the schedule as it is.",
        )

    def settings(self) -> dict:
        """Return the settings the form describes; objects parsed from JSON (errors by field)."""
        values = {}
        for spec in dataclasses.fields(LoopSettings):
            value = self.cleaned_data.get(spec.name)
            if str(spec.type).startswith("dict"):
                try:
                    value = json.loads(value or "{}")
                except json.JSONDecodeError as exc:
                    raise control.InvalidLoopSettings(
                        f"{spec.name}: not JSON ({exc.msg}).", field=spec.name
                    ) from exc
            elif value == "" and _keeps_default(spec):
                value = spec.default
            values[spec.name] = value
        return values


def _project(request: HttpRequest, project_id: int) -> Project:
    return console_project(user=request.user, project_id=project_id)


def _page_context(request: HttpRequest, project: Project, **extra) -> dict:
    timeline = loop_timeline(project=project)
    return console_context(
        request=request,
        project=project,
        section="loop",
        poll_seconds=POLL_SECONDS,
        timeline=timeline,
        **extra,
    )


def _form(project: Project, data=None) -> LoopSettingsForm:
    timeline = loop_timeline(project=project)
    if timeline.has_loop:
        initial = timeline.settings
    else:
        defaults = {
            spec.name: spec.default_factory()
            if spec.default_factory is not dataclasses.MISSING
            else spec.default
            for spec in dataclasses.fields(LoopSettings)
            if spec.name != "path"
        }
        initial = {**defaults, "path": ""}
    return LoopSettingsForm(data, initial_settings=initial, every_seconds=timeline.every_seconds)


@login_required
@require_GET
def loop_page(request: HttpRequest, project_id: int) -> HttpResponse:
    """Show the loop: its state, actions and timeline (polled), and its settings form."""
    project = _project(request, project_id)
    context = _page_context(request, project, form=_form(project))
    return render(request, "console/loop.html", context)


@login_required
@require_GET
def loop_live(request: HttpRequest, project_id: int) -> HttpResponse:
    """Return the loop's state, actions and timeline alone (htmx polls it)."""
    project = _project(request, project_id)
    return render(request, "console/loop_live.html", _page_context(request, project))


@login_required
@require_POST
def loop_settings_save(request: HttpRequest, project_id: int) -> HttpResponse:
    """Save the settings (creating the loop); show what is wrong by field, saving nothing."""
    project = _project(request, project_id)
    form = _form(project, request.POST)
    if form.is_valid():
        try:
            control.loop_update(
                project=project,
                settings=form.settings(),
                user=request.user,
                every_seconds=form.cleaned_data.get("every_seconds"),
            )
        except ServiceError as exc:
            named = (getattr(exc, "field", "") or "").split(".")[0]
            form.add_error(named if named in form.fields else None, exc.message)
        else:
            messages.success(request, "Loop settings saved.")
            return redirect("console:loop", project.pk)
    context = _page_context(request, project, form=form)
    return render(request, "console/loop.html", context, status=400)


def _act(request: HttpRequest, project: Project, action, done: str) -> HttpResponse:
    try:
        action()
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect("console:loop", project.pk)


@login_required
@require_POST
def loop_step(request: HttpRequest, project_id: int) -> HttpResponse:
    """Queue a tick now: the loop advances as far as it can."""
    project = _project(request, project_id)
    return _act(
        request,
        project,
        lambda: control.loop_step_queue(project=project),
        "Next step queued: the timeline below updates as it runs.",
    )


@login_required
@require_POST
def loop_pause(request: HttpRequest, project_id: int) -> HttpResponse:
    """Pause the loop (and its schedule)."""
    project = _project(request, project_id)
    return _act(
        request, project, lambda: control.loop_pause(project=project, paused=True), "Loop paused."
    )


@login_required
@require_POST
def loop_resume(request: HttpRequest, project_id: int) -> HttpResponse:
    """Resume the loop (and its schedule)."""
    project = _project(request, project_id)
    return _act(
        request,
        project,
        lambda: control.loop_pause(project=project, paused=False),
        "Loop resumed.",
    )


def _found(lookup):
    """Return what `lookup` finds; an id of nothing in this project is a 404, as in the API."""
    try:
        return lookup()
    except NotFound as exc:
        raise Http404(exc.message) from exc


def _decide(request: HttpRequest, project_id: int, version_id: int, promote: bool):
    project = _project(request, project_id)
    reason = request.POST.get("reason", "")
    version = _found(
        lambda: control.loop_policy_for(project=project, version_id=version_id, user=request.user)
    )

    def decide():
        control.loop_policy_decide(
            version=version, user=request.user, promote=promote, reason=reason
        )

    verb = "promoted" if promote else "rejected"
    return _act(request, project, decide, f"Model version {version_id} {verb}.")


@login_required
@require_POST
def loop_promote(request: HttpRequest, project_id: int, version_id: int) -> HttpResponse:
    """Promote a policy by hand, with a reason."""
    return _decide(request, project_id, version_id, promote=True)


@login_required
@require_POST
def loop_reject(request: HttpRequest, project_id: int, version_id: int) -> HttpResponse:
    """Reject a policy by hand, with a reason."""
    return _decide(request, project_id, version_id, promote=False)


@login_required
@require_POST
def loop_run_cancel(request: HttpRequest, project_id: int, run_id: int) -> HttpResponse:
    """Cancel a queued or running training run of the loop."""
    project = _project(request, project_id)
    _found(lambda: control.loop_run_for(project=project, run_id=run_id))
    return _act(
        request,
        project,
        lambda: control.loop_run_cancel(project=project, run_id=run_id),
        f"Run {run_id} cancelled.",
    )
