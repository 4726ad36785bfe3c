"""Researchers' evaluation dashboard: server-rendered pages, Chart.js charts, CSV per chart.

Who may look: staff see every project; a project's researchers see that project. Other
members of the project (annotators, reviewers) get 403, everyone else 404, anonymous users
the login page. Charts get their data through ``json_script`` (a JSON data block, allowed by
the CSP) and are drawn by the ES modules in ``static/dashboard/``; ``?format=csv&chart=<key>``
on any page returns the numbers of one of its charts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_GET

from annotation.access import MANAGER, project_for
from annotation.errors import Forbidden, NotFound
from annotation.models import Project, Round
from config.console.dashboard import data as loading
from config.console.dashboard.csv_export import csv_response
from config.console.dashboard.data import ProjectData
from config.console.dashboard.panel import Panel
from config.console.dashboard.specs import spec_json
from config.console.dashboard.tabs import (
    annotators,
    labels,
    models,
    policy_samples,
    reward_models,
    training,
)
from config.console.dashboard.tabs import home as home_tab
from training.models import ModelVersion, TrainingRun
from training.selectors import training_run_get

TABS = (
    ("labels", "Labels", "dashboard:project"),
    ("models", "Models", "dashboard:models"),
    ("reward", "Reward models", "dashboard:reward-models"),
    ("training", "Training", "dashboard:training"),
)

Builders = dict[str, Callable[[], Panel | None]]
# How often the live panels (runs, progress, QC state) refresh while a page is open.
LIVE_SECONDS = 5
# Panels refreshed while the page is open: progress and QC state, and a run that is not over.
LABELS_LIVE = ("progress", "annotators")
RUN_LIVE = ("runs", "curves", "alarms")


def _project_for(request: HttpRequest, project_id: int) -> Project:
    """Return the project if the user may read its dashboard; 403 for other members, else 404."""
    try:
        return project_for(user=request.user, project_id=project_id, role=MANAGER)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except Forbidden as exc:
        raise PermissionDenied(
            "Only the project's researchers and staff see its dashboard."
        ) from exc


def _int_param(request: HttpRequest, name: str) -> int | None:
    try:
        return int(request.GET.get(name, ""))
    except ValueError:
        return None


def _page(
    request: HttpRequest,
    *,
    builders: Builders,
    context: dict,
    csv_prefix: str,
    template: str = "dashboard/panels.html",
    live: Iterable[str] = (),
) -> HttpResponse:
    """Render the panels, one panel's CSV (``?format=csv&chart=<key>``) or one live panel."""
    # The panels named in ``live`` carry a URL (``?panel=<key>``) that htmx polls every
    # LIVE_SECONDS, answered with that panel alone (its chart spec in ``data-chart-spec``).
    if request.GET.get("format") == "csv":
        builder = builders.get(request.GET.get("chart", ""))
        panel = builder() if builder else None
        if panel is None:
            raise Http404("No such chart on this page.")
        return csv_response(panel.columns, panel.rows, f"{csv_prefix}-{panel.key}")
    query = request.GET.copy()
    for name in ("format", "chart", "panel"):
        query.pop(name, None)
    live = set(live)

    def links(panel: Panel) -> Panel:
        panel_query = query.copy()
        panel_query["format"] = "csv"
        panel_query["chart"] = panel.key
        panel.csv_url = f"?{panel_query.urlencode()}"
        if panel.key in live:
            live_query = query.copy()
            live_query["panel"] = panel.key
            panel.live_url = f"{request.path}?{live_query.urlencode()}"
        return panel

    if "panel" in request.GET:
        key = request.GET["panel"]
        panel = builders[key]() if key in builders and key in live else None
        if panel is None:
            raise Http404("No such live panel on this page.")
        # The spec rides in an attribute: htmx drops <script> elements from what it swaps in.
        chart = (
            json.dumps(spec_json(panel.chart), cls=DjangoJSONEncoder)
            if panel.chart and panel.has_data
            else ""
        )
        return render(
            request,
            "dashboard/_panel.html",
            {"panel": links(panel), "live_chart": chart, "live_seconds": LIVE_SECONDS},
        )
    built = (build() for build in builders.values())
    panels = [links(panel) for panel in built if panel is not None]
    charts = {p.key: spec_json(p.chart) for p in panels if p.chart and p.has_data}
    return render(
        request,
        template,
        {**context, "panels": panels, "charts": charts, "live_seconds": LIVE_SECONDS},
    )


def _tabs(project: Project, active: str) -> list[dict]:
    return [
        {
            "key": key,
            "label": label,
            "url": reverse(name, args=[project.pk]),
            "active": key == active,
        }
        for key, label, name in TABS
    ]


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """List the projects whose dashboard the user may read."""
    projects = loading.dashboard_projects(user=request.user)
    if not projects and not request.user.is_staff:
        raise PermissionDenied("The dashboard is for researchers and staff.")
    overview = cache(lambda: home_tab.project_overview_panel(projects=projects))
    keys = [column.replace(" ", "_") for column in overview().columns]
    rows = {row[0]: row for row in overview().rows}
    cards = [{"project": p, "stats": dict(zip(keys, rows[p.pk], strict=True))} for p in projects]
    return _page(
        request,
        builders={"projects": overview},
        context={"cards": cards},
        csv_prefix="projects",
        template="dashboard/home.html",
    )


@require_GET
@login_required
def project_labels(request: HttpRequest, project_id: int) -> HttpResponse:
    """Label quality: round progress, label mix, position bias, agreement, annotators."""
    project = _project_for(request, project_id)
    rounds = list(Round.objects.filter(project=project).order_by("number"))
    number = _int_param(request, "round")
    selected = next((r for r in rounds if r.number == number), None)
    data = ProjectData(project, round_=selected)
    builders: Builders = {
        "progress": lambda: labels.round_progress_panel(data),
        "labels": lambda: labels.label_distribution_panel(data),
        "position-bias": lambda: labels.position_bias_panel(data),
        "agreement": lambda: annotators.agreement_panel(data),
        "consensus": lambda: annotators.annotator_agreement_panel(data),
        "ai-agreement": lambda: annotators.ai_agreement_panel(data),
        "annotators": lambda: annotators.annotator_quality_panel(data),
        "disagreements": lambda: annotators.disagreement_panel(data),
    }
    return _page(
        request,
        builders=builders,
        context={
            "project": project,
            "tabs": _tabs(project, "labels"),
            "heading": "Label quality",
            "rounds": rounds,
            "selected_round": selected,
            "data": data,
        },
        csv_prefix=f"{slugify(project.name)}-labels",
        live=LABELS_LIVE,
    )


@require_GET
@login_required
def project_models(request: HttpRequest, project_id: int) -> HttpResponse:
    """Model comparison: leaderboard, battles, win rates, true reward, samples, policy samples."""
    project = _project_for(request, project_id)
    data = ProjectData(project)
    builders: Builders = {
        "leaderboard": lambda: models.leaderboard_panel(data),
        "winrates": lambda: models.win_rate_panel(data),
        "true-reward": lambda: models.true_reward_panel(data),
        "battles": lambda: models.battle_counts_panel(data),
        "samples": lambda: models.samples_panel(data),
    }
    policies = policy_samples.evaluated_policies(project=project)
    selected = policies[-1] if policies else None
    if "policy" in request.GET:
        wanted = _int_param(request, "policy")
        selected = next((v for v in policies if v.pk == wanted), None)
        if selected is None:
            raise Http404(
                "policy: no policy version of this project's loop evaluation has this id."
            )
    if selected is not None:
        chosen = cache(lambda: policy_samples.policy_samples(version=selected))
        builders |= {
            "policy-top-reward": lambda: policy_samples.top_reward_panel(chosen()),
            "policy-top-kl": lambda: policy_samples.top_kl_panel(chosen()),
            "policy-reward-kl": lambda: policy_samples.reward_kl_panel(chosen(), policies),
            "policy-vs-previous": lambda: policy_samples.side_by_side_panel(chosen()),
            "policy-text-stats": lambda: policy_samples.text_stats_panel(policies),
        }
    return _page(
        request,
        builders=builders,
        context={
            "project": project,
            "tabs": _tabs(project, "models"),
            "heading": "Models",
            "data": data,
            "policies": policies,
            "selected_policy": selected,
        },
        csv_prefix=f"{slugify(project.name)}-models",
    )


@require_GET
@login_required
def project_reward_models(request: HttpRequest, project_id: int) -> HttpResponse:
    """Reward models: stored metrics of each, calibration and margins of the selected one."""
    project = _project_for(request, project_id)
    data = ProjectData(project)
    versions = data.reward_models
    wanted = _int_param(request, "rm")
    selected = next((v for v in versions if v.pk == wanted), None)
    if selected is None:
        evaluated = [v for v in versions if (v.eval_results or {}).get("rm_metrics")]
        selected = (evaluated or versions or [None])[-1]
    builders: Builders = {"reward-models": lambda: reward_models.reward_model_table_panel(versions)}
    if selected is not None:
        builders["calibration"] = lambda: reward_models.calibration_panel(selected)
        builders["margins"] = lambda: reward_models.margin_panel(selected)
        builders["length-buckets"] = lambda: reward_models.length_bucket_panel(selected)
        builders["rm-calibration"] = lambda: reward_models.calibration_summary_panel(selected)
    builders["agreement"] = cache(lambda: reward_models.human_agreement_context_panel(data))
    return _page(
        request,
        builders=builders,
        context={
            "project": project,
            "tabs": _tabs(project, "reward"),
            "heading": "Reward models",
            "reward_models": versions,
            "selected_rm": selected,
        },
        csv_prefix=f"{slugify(project.name)}-reward-models",
    )


@require_GET
@login_required
def project_training(request: HttpRequest, project_id: int) -> HttpResponse:
    """Training runs of the project and the curves of the selected one."""
    project = _project_for(request, project_id)
    runs = ProjectData(project).runs
    wanted = _int_param(request, "run")
    selected = next((r for r in runs if r.pk == wanted), None)
    if selected is None:
        selected = next((r for r in runs if loading.read_metrics(r)), runs[0] if runs else None)
    return _page(
        request,
        builders=_run_builders(selected, runs),
        context={
            "project": project,
            "tabs": _tabs(project, "training"),
            "heading": "Training",
            "runs": runs,
            "selected_run": selected,
        },
        csv_prefix=f"{slugify(project.name)}-training",
        live=_run_live(selected),
    )


def _run_live(run: TrainingRun | None) -> tuple[str, ...]:
    """Return the panels to refresh: the runs always, a run's curves while it is not over."""
    if run is not None and run.status in (TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING):
        return RUN_LIVE
    return ("runs",)


def _run_builders(run: TrainingRun | None, runs: list[TrainingRun]) -> Builders:
    builders: Builders = {"runs": lambda: training.runs_panel(runs)}
    if run is not None:
        both = cache(lambda: training.curves_panel(run))
        builders["alarms"] = lambda: both()[1]
        builders["curves"] = lambda: both()[0]
    return builders


@require_GET
@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """Curves and alarms of one training run (with or without a project)."""
    run = training_run_get(user=request.user, run_id=run_id)
    if run is None:
        if TrainingRun.objects.filter(pk=run_id, project__memberships__user=request.user).exists():
            raise PermissionDenied("Only the project's researchers and staff see its runs.")
        raise Http404("No such run.")
    try:
        version = run.model_version
    except ModelVersion.DoesNotExist:
        version = None
    return _page(
        request,
        builders=_run_builders(run, [run]),
        context={
            "project": run.project,
            "tabs": _tabs(run.project, "training") if run.project else [],
            "heading": f"Training run {run.pk}",
            "run": run,
            "run_version": version,
        },
        csv_prefix=f"run-{run.pk}",
        live=_run_live(run),
    )
