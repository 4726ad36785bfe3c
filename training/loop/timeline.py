"""A project's loop timeline: what its iterations left behind, round by round.

round -> dataset version -> runs -> model versions -> evaluation -> gate -> next round. Steps
that leave no row of their own (evaluate, gate, export failures) are filled from the newest
`LoopEvent` a tick recorded about them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from annotation.models import DatasetVersion, Judgment, LabelSource, Project, Round
from training import config_policy
from training.loop.control import loop_settings
from training.loop.schedule import loop_schedule_get
from training.loop.settings import LoopSettings
from training.loop.steps import loop_key
from training.models import Loop, LoopEvent, ModelVersion, PolicyEvaluation, TrainingRun


@dataclass
class TimelineStep:
    """One step of an iteration as the timeline shows it."""

    kind: str  # round | export | train | model | evaluate | gate | next_round
    title: str
    status: str
    detail: str = ""
    error: str = ""
    progress: float | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_seconds: float | None = None
    round_number: int | None = None
    dataset_version: int | None = None
    run_id: int | None = None
    model_version_id: int | None = None
    active: bool = False


@dataclass
class Iteration:
    """What one iteration of the loop (keyed by the round it learns from) left behind."""

    key: str
    round_number: int
    steps: list[TimelineStep] = field(default_factory=list)


@dataclass
class TimelineEvent:
    """One recorded step of a tick (a `LoopEvent`)."""

    key: str
    step: str
    status: str
    detail: str
    started_at: datetime | None
    duration_seconds: float | None
    round_number: int | None
    run_id: int | None
    model_version_id: int | None


@dataclass
class Timeline:
    """The loop's state and its iterations, newest first."""

    project_id: int
    has_loop: bool
    paused: bool
    settings: dict
    every_seconds: int | None
    schedule_enabled: bool | None
    last_tick_at: datetime | None
    last_tick_status: str
    last_error: str
    last_steps: list
    iterations: list[Iteration]
    events: list[TimelineEvent]

    @property
    def active(self) -> bool:
        """Return whether anything is still moving (the page keeps polling while it is)."""
        return any(step.active for it in self.iterations for step in it.steps)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def _round_step(round_: Round, project: Project, settings: LoopSettings | None) -> TimelineStep:
    items = round_.items.filter(is_gold=False).count()
    sources = settings.sources if settings is not None else [LabelSource.HUMAN]
    labels = Judgment.objects.filter(item__round=round_).primary().of_sources(sources).count()
    needed = items * project.overlap
    if settings is not None and settings.min_new_judgments:
        needed = settings.min_new_judgments
    progress = min(1.0, labels / needed) if needed else None
    detail = f"{items} items, {labels} of {needed} labels" if needed else f"{items} items"
    return TimelineStep(
        kind="round",
        title=f"Round {round_.number}",
        status=round_.status,
        detail=detail,
        progress=progress,
        started_at=round_.created_at,
        finished_at=round_.closed_at,
        duration_seconds=_seconds(round_.created_at, round_.closed_at),
        round_number=round_.number,
        active=round_.status == Round.Status.OPEN,
    )


def _export_step(dataset: DatasetVersion) -> TimelineStep:
    return TimelineStep(
        kind="export",
        title=f"Dataset v{dataset.version}",
        status=dataset.status,
        detail=", ".join(f"{k} {v}" for k, v in sorted((dataset.split_counts or {}).items())),
        error=config_policy.paths_redact(dataset.error)[-1000:],
        started_at=dataset.created_at,
        finished_at=dataset.finished_at,
        duration_seconds=_seconds(dataset.created_at, dataset.finished_at),
        dataset_version=dataset.version,
        active=dataset.status == DatasetVersion.Status.BUILDING,
    )


def _run_step(run: TrainingRun) -> TimelineStep:
    from training.services import TERMINAL_STATUSES

    return TimelineStep(
        kind="train",
        title=f"{run.get_recipe_display()} run {run.pk}",
        status=run.status,
        detail=", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in sorted((run.current_metrics or {}).items())
            if k in ("step", "max_steps", "loss")
        ),
        error=config_policy.paths_redact(run.error, keep=run.output_dir)[-1000:],
        progress=run.progress,
        started_at=run.started_at or run.created_at,
        finished_at=run.finished_at,
        duration_seconds=_seconds(run.started_at, run.finished_at),
        run_id=run.pk,
        active=run.status not in TERMINAL_STATUSES,
    )


def _recorded(step: TimelineStep, event: LoopEvent | None) -> TimelineStep:
    """Fill a step from the newest tick event about it: its outcome, duration and error."""
    if event is None:
        return step
    detail = config_policy.paths_redact(event.detail)
    step.status = event.status if step.status in ("waiting", "") else step.status
    if event.status == "failed":
        step.status, step.error = "failed", step.error or detail
    elif not step.detail:
        step.detail = detail
    if step.duration_seconds is None:
        step.duration_seconds = event.duration_seconds
        step.started_at = step.started_at or event.started_at
        step.finished_at = step.finished_at or event.finished_at
    return step


def _model_steps(version: ModelVersion, events: dict) -> list[TimelineStep]:
    model = TimelineStep(
        kind="model",
        title=f"{version.get_kind_display()} {version.name}",
        status=version.status,
        error=version.validation_error[-1000:],
        started_at=version.created_at,
        model_version_id=version.pk,
        active=version.status in (ModelVersion.Status.PENDING, ModelVersion.Status.VALIDATING),
    )
    if version.kind == ModelVersion.Kind.REWARD:
        return [model]
    evaluations = list(PolicyEvaluation.objects.filter(policy=version).order_by("id"))
    parts = [
        f"{e.judge}: {e.win_rate:.2f} [{e.ci_low:.2f}, {e.ci_high:.2f}]"
        if e.win_rate is not None and e.ci_low is not None and e.ci_high is not None
        else f"{e.judge}: {e.wins}/{e.ties}/{e.losses}"
        for e in evaluations
    ]
    if "true_reward" in (version.eval_results or {}):
        parts.append(f"true reward {version.eval_results['true_reward']:.3f}")
    evaluate = TimelineStep(
        kind="evaluate",
        title="Evaluation",
        status="done" if parts else "waiting",
        detail="; ".join(parts),
        model_version_id=version.pk,
    )
    gate = TimelineStep(
        kind="gate",
        title="Gate",
        status=version.promotion or "undecided",
        detail=version.promotion_reason,
        finished_at=version.promoted_at,
        model_version_id=version.pk,
    )
    return [
        model,
        _recorded(evaluate, events.get((version.pk, "evaluate"))),
        _recorded(gate, events.get((version.pk, "gate"))),
    ]


def loop_timeline(*, project: Project) -> Timeline:
    """Return the loop's state and, per round, what each step of its iteration left behind."""
    found = Loop.objects.filter(project=project).first()
    settings = loop_settings(loop=found) if found is not None and found.config else None
    schedule = loop_schedule_get(project_id=project.pk)
    rounds = list(
        Round.objects.filter(project=project)
        .exclude(purpose=Round.Purpose.EVAL)
        .order_by("-number")
    )
    datasets = {
        d.name: d
        for d in DatasetVersion.objects.filter(
            project=project, name__startswith=f"loop-{project.pk}-r"
        ).order_by("version")
    }
    by_source = {r.source_key: r for r in rounds if r.source_key}
    # The newest event of each (model version, step) and (iteration, step): durations and
    # errors of the steps that leave no row of their own (evaluate, gate, export failures).
    by_version: dict[tuple[int, str], LoopEvent] = {}
    by_key: dict[tuple[str, str], LoopEvent] = {}
    if found is not None:
        for event in found.events.exclude(status="waiting").order_by("started_at", "id"):
            if event.model_version_id is not None:
                by_version[(event.model_version_id, event.step)] = event
            by_key[(event.key, event.step)] = event
    iterations = []
    for round_ in rounds:
        key = loop_key(round_)
        it = Iteration(key=key, round_number=round_.number)
        it.steps.append(_round_step(round_, project, settings))
        dataset = datasets.get(key)
        if dataset is not None:
            it.steps.append(_recorded(_export_step(dataset), by_key.get((key, "export"))))
            runs = (
                TrainingRun.objects.filter(dataset_version=dataset)
                .select_related("model_version")
                .order_by("id")
            )
            for run in runs:
                it.steps.append(_run_step(run))
                version = getattr(run, "model_version", None)
                if version is not None:
                    it.steps.extend(_model_steps(version, by_version))
        following = by_source.get(f"{key}:gen")
        if following is not None:
            job = getattr(following, "generation_job", None)
            items = following.items.count()
            it.steps.append(
                TimelineStep(
                    kind="next_round",
                    title=f"Round {following.number}",
                    status=job.status if job is not None else ("done" if items else "generating"),
                    detail=f"{items} items",
                    error=config_policy.paths_redact(job.error)[-1000:] if job else "",
                    progress=job.progress if job is not None else None,
                    started_at=following.created_at,
                    finished_at=job.finished_at if job is not None else None,
                    round_number=following.number,
                    active=not items,
                )
            )
        iterations.append(it)
    events = []
    if found is not None:
        for event in found.events.select_related("round")[:30]:
            events.append(
                TimelineEvent(
                    key=event.key,
                    step=event.step,
                    status=event.status,
                    detail=config_policy.paths_redact(event.detail),
                    started_at=event.started_at,
                    duration_seconds=event.duration_seconds,
                    round_number=event.round.number if event.round_id else None,
                    run_id=event.training_run_id,
                    model_version_id=event.model_version_id,
                )
            )
    return Timeline(
        project_id=project.pk,
        has_loop=found is not None,
        paused=found.paused if found is not None else False,
        settings=found.config if found is not None else {},
        every_seconds=schedule.interval.every if schedule and schedule.interval else None,
        schedule_enabled=schedule.enabled if schedule is not None else None,
        last_tick_at=found.last_tick_at if found else None,
        last_tick_status=found.last_tick_status if found else "",
        last_error=config_policy.paths_redact(found.last_error) if found else "",
        last_steps=[
            {**step, "detail": config_policy.paths_redact(step.get("detail", ""))}
            for step in (found.last_steps if found else [])
        ],
        iterations=iterations,
        events=events,
    )
