"""A project's loop: its one record, every tick's outcome, the actions on it.

`training.Loop` is the one home of a project's loop settings and pause flag. The beat schedule
(`schedule.py`) carries only the project id; every way of ticking (beat, the API's and the
console's "run next step", `manage.py loop`) goes through `loop_tick_run`, which reads the
row, records each step of the iteration as a `LoopEvent` (`LoopState.add`) and the tick's
outcome on the row. A tick that raises is recorded with its traceback, then re-raised: a
failed tick is never lost.

Its timeline (what the iterations left behind) is read by `training.loop.timeline`.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from annotation.errors import Conflict, NotFound, ServiceError
from annotation.exports.policy import AGGREGATIONS
from annotation.models import LabelSource, Project, Round
from training import config_policy
from training.loop.schedule import (
    loop_schedule_pause,
    loop_schedule_set,
)
from training.loop.settings import TRAIN_ROUNDS, LoopSettings
from training.loop.steps import RECORDING_LOOP, LoopState, Step, loop_advance, loop_key
from training.models import Loop, LoopEvent, ModelVersion, TrainingRun

logger = logging.getLogger(__name__)

PROMPT_SOURCES = ("pool", "demo")
RECIPE_OVERRIDES = ("dpo", "reward", "ppo")
MIN_EVERY_SECONDS = 10
# Last tick outcomes stored on Loop.last_tick_status.
TICK_DONE = "done"
TICK_FAILED = "failed"
TICK_PAUSED = "paused"
# First key of the advisory lock a tick holds (the second is the loop's id).
TICK_LOCK_SPACE = 0x100F
NO_LOOP = "This project has no loop yet: save its settings (at least 'path') to create it."


class InvalidLoopSettings(ServiceError):
    """Loop settings the server refuses; ``field`` names the culprit."""

    code = "invalid_loop_settings"

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.field = field


def _refuse(field: str, message: str) -> InvalidLoopSettings:
    return InvalidLoopSettings(f"{field}: {message}", field=field)


# --------------------------------------------------------------------------- settings


def _type_ok(annotation: str, value: Any) -> bool:
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation == "str":
        return isinstance(value, str)
    if annotation.startswith("list"):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if annotation.startswith("dict"):
        return isinstance(value, dict)
    return True  # a field of another kind is checked by LoopSettings.from_dict


_TYPE_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "text"}


def loop_settings_validate(
    *, values: Any, project: Project, user=None, base: dict | None = None
) -> LoopSettings:
    """Return the settings `values` describe (over `base`), or refuse naming the field.

    ``user`` None is the server itself (trusted like staff). A researcher names models in the
    recipe overrides by ids of this project, never by path (`training.config_policy`).
    """
    if not isinstance(values, dict):
        raise _refuse("settings", "expected an object of loop setting names to values.")
    fields = {f.name: f for f in dataclasses.fields(LoopSettings)}
    for name in sorted(values):
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise _refuse(name, f"not a loop setting; known settings: {known}.")
        annotation = str(fields[name].type)
        if not _type_ok(annotation, values[name]):
            kind = _TYPE_WORDS.get(annotation, "a list of names")
            if annotation.startswith("dict"):
                kind = "an object"
            raise _refuse(name, f"expected {kind}.")
    merged = {**(base or {}), **values}
    if not merged.get("path"):
        raise _refuse("path", "choose how the loop learns: 'dpo' or 'rm_ppo' (no default).")
    checks = (
        ("path", lambda v: v in ("dpo", "rm_ppo"), "must be 'dpo' or 'rm_ppo'."),
        ("n_prompts", lambda v: 1 <= v <= 100_000, "must be between 1 and 100000."),
        ("k", lambda v: 2 <= v <= 16, "must be between 2 and 16."),
        ("min_new_judgments", lambda v: v >= 0, "must be 0 or more."),
        ("seed", lambda v: v >= 0, "must be 0 or more."),
        ("random_share", lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1."),
        ("prompt_source", lambda v: v in PROMPT_SOURCES, "must be 'pool' or 'demo'."),
        ("train_rounds", lambda v: v in TRAIN_ROUNDS, "must be 'all' or 'newest'."),
        (
            "aggregation",
            lambda v: v in AGGREGATIONS,
            f"must be one of {', '.join(AGGREGATIONS)}.",
        ),
        (
            "sources",
            lambda v: bool(v) and set(v) <= set(LabelSource.values),
            f"name one or more of {', '.join(LabelSource.values)}.",
        ),
    )
    for name, ok, message in checks:
        if name in merged and not ok(merged[name]):
            raise _refuse(name, message)
    if "generation" in merged:
        _check_generation(merged["generation"])
    for recipe in RECIPE_OVERRIDES:
        if merged.get(recipe):
            _check_recipe(recipe, merged[recipe], user=user, project=project)
    try:
        return LoopSettings.from_dict(merged)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        named = message.split(" ", 1)[0].strip(":")
        if named.split(".")[0] not in fields:
            raise _refuse("settings", message) from exc
        raise _refuse(named, message[len(named) :].strip(" :")) from exc


def _check_generation(values: dict) -> None:
    from training.generation import GenerationSettings

    known = {f.name for f in dataclasses.fields(GenerationSettings)} - {"seed"}
    for key in sorted(values):
        if key not in known:
            raise _refuse(
                f"generation.{key}",
                f"not a sampling setting; known: {', '.join(sorted(known))} "
                "(the seed is the loop's seed).",
            )
        if not isinstance(values[key], int | float | list) or isinstance(values[key], bool):
            raise _refuse(f"generation.{key}", "expected a number (stop: a list of strings).")
    try:
        GenerationSettings(**values)
    except (TypeError, ValueError) as exc:
        raise _refuse("generation", str(exc)) from exc


def _check_recipe(recipe: str, overrides: dict, *, user, project: Project) -> None:
    """Refuse recipe overrides that a run created by `user` in `project` would refuse."""
    try:
        config_policy.training_config_resolve(
            recipe=recipe, config=overrides, user=user, project=project
        )
    except config_policy.InvalidTrainingConfig as exc:
        inner = exc.field.removeprefix("config.") or "config"
        message = exc.message.split(": ", 1)[-1]
        raise _refuse(f"{recipe}.{inner}", message) from exc
    except NotFound as exc:
        raise NotFound(f"{recipe}.{exc.message.removeprefix('config.')}") from exc


# --------------------------------------------------------------------------- the record


def loop_get(*, project: Project) -> Loop:
    """Return the project's loop, or raise Conflict (the project has none yet)."""
    found = Loop.objects.filter(project=project).first()
    if found is None:
        raise Conflict(NO_LOOP)
    return found


def loop_settings(*, loop: Loop) -> LoopSettings:
    """Return the loop's stored settings."""
    return LoopSettings.from_dict(loop.config)


def loop_create(
    *, project: Project, settings: dict, user=None, every_seconds: int | None = None
) -> Loop:
    """Create the project's loop from settings (validated); Conflict if it has one."""
    checked = loop_settings_validate(values=settings, project=project, user=user)
    every = _check_every(every_seconds)
    with transaction.atomic():
        if Loop.objects.filter(project=project).exists():
            raise Conflict("This project already has a loop: change its settings instead.")
        found = Loop.objects.create(project=project, config=checked.to_dict())
        if every is not None:
            loop_schedule_set(project=project, every_seconds=every, enabled=True)
    return found


def loop_update(
    *, project: Project, settings: dict, user=None, every_seconds: int | None = None
) -> Loop:
    """Change the given settings of the project's loop (creating it if it has none)."""
    every = _check_every(every_seconds)
    with transaction.atomic():
        found = Loop.objects.select_for_update().filter(project=project).first()
        base = found.config if found is not None else None
        checked = loop_settings_validate(values=settings, project=project, user=user, base=base)
        if found is None:
            found = Loop.objects.create(project=project, config=checked.to_dict())
        else:
            found.config = checked.to_dict()
            found.save(update_fields=["config", "updated_at"])
        if every is not None:
            loop_schedule_set(project=project, every_seconds=every, enabled=not found.paused)
    return found


def _check_every(every_seconds: Any) -> int | None:
    if every_seconds is None:
        return None
    if isinstance(every_seconds, bool) or not isinstance(every_seconds, int):
        raise _refuse("every_seconds", "expected an integer number of seconds.")
    if every_seconds < MIN_EVERY_SECONDS:
        raise _refuse("every_seconds", f"tick at most every {MIN_EVERY_SECONDS} seconds.")
    return every_seconds


def loop_pause(*, project: Project, paused: bool = True) -> Loop:
    """Pause (or resume) the project's loop: no tick advances it while paused."""
    with transaction.atomic():
        found = Loop.objects.select_for_update().filter(project=project).first()
        if found is None:
            raise Conflict(NO_LOOP)
        found.paused = paused
        found.save(update_fields=["paused", "updated_at"])
        loop_schedule_pause(project=project, paused=paused)
    return found


def loop_step_queue(*, project: Project, force: bool = False) -> Loop:
    """Queue a tick of the project's loop now (after commit); Conflict while it is paused."""
    found = loop_get(project=project)
    if found.paused:
        raise Conflict("The loop is paused: resume it to run its next step.")
    from training.loop_tasks import loop_tick

    project_id = project.pk
    transaction.on_commit(lambda: loop_tick.delay(project_id, force=force))
    return found


# --------------------------------------------------------------------------- a tick


def loop_tick_run(*, project_id: int, sync: bool = False, force: bool = False) -> LoopState:
    """Advance the project's loop as far as it can go now; record every step and the outcome.

    A paused loop does nothing, and neither does a tick while another tick of the same loop
    runs (beat and "run the next step" at once would otherwise both start the same run). An
    exception anywhere is recorded on the loop row (status failed, the traceback in
    last_error) and as a failed `tick` event, then re-raised.
    """
    found = Loop.objects.select_related("project").filter(project_id=project_id).first()
    if found is None:
        raise NotFound(f"Project {project_id} has no loop.")
    if found.paused:
        state = LoopState(key="-", loop_id=None)
        state.add("tick", "skipped", "the project's loop is paused")
        _outcome_store(found, TICK_PAUSED, state.steps, error="")
        return state
    with _tick_lock(found.pk) as acquired:
        if not acquired:
            state = LoopState(key="-", loop_id=None)
            state.add("tick", "skipped", "another tick of this loop is running")
            return state
        return _tick(found, sync=sync, force=force)


@contextmanager
def _tick_lock(loop_id: int):
    """Hold the loop's tick lock (a PostgreSQL advisory lock) while the block runs, if free.

    Yields whether it was acquired. Other databases (the single-process SQLite demo) have no
    such lock; there a tick always runs.
    """
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [TICK_LOCK_SPACE, loop_id])
        acquired = bool(cursor.fetchone()[0])
    try:
        yield acquired
    finally:
        if acquired:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [TICK_LOCK_SPACE, loop_id])
            except DatabaseError:  # an aborted transaction: the lock ends with the session
                logger.warning("loop %s: tick lock left to the end of the session", loop_id)


def _tick(found: Loop, *, sync: bool, force: bool) -> LoopState:
    project_id = found.project_id
    token = RECORDING_LOOP.set(found.pk)
    try:
        state = loop_advance(
            project=found.project, settings=loop_settings(loop=found), sync=sync, force=force
        )
    except Exception as exc:
        error = traceback.format_exc()
        logger.exception("loop of project %s: the tick failed", project_id)
        key = _current_key(found.project)
        LoopEvent.objects.create(
            loop=found,
            key=key,
            step="tick",
            status="failed",
            detail=config_policy.paths_redact(f"{type(exc).__name__}: {exc}")[-2000:],
            finished_at=timezone.now(),
        )
        _outcome_store(found, TICK_FAILED, [], error=error)
        raise
    finally:
        RECORDING_LOOP.reset(token)
    failed = any(step.status == "failed" for step in state.steps)
    errors = "\n".join(f"{s.name}: {s.detail}" for s in state.steps if s.status == "failed")
    _outcome_store(found, TICK_FAILED if failed else TICK_DONE, state.steps, error=errors)
    return state


def _current_key(project: Project) -> str:
    newest = Round.objects.filter(project=project).order_by("-number").first()
    return loop_key(newest) if newest is not None else "-"


def _outcome_store(found: Loop, status: str, steps: list[Step], *, error: str) -> None:
    """Store a tick's outcome; researchers read it, so no server path is left in it."""
    redact = config_policy.paths_redact
    Loop.objects.filter(pk=found.pk).update(
        last_tick_at=timezone.now(),
        last_tick_status=status,
        last_error=redact(error)[-20_000:],
        last_steps=[{**dataclasses.asdict(step), "detail": redact(step.detail)} for step in steps],
    )


# --------------------------------------------------------------------------- actions


def loop_run_for(*, project: Project, run_id: int) -> TrainingRun:
    """Return a training run of the project's loop (trained on one of its loop exports)."""
    run = (
        TrainingRun.objects.filter(
            pk=run_id, project=project, dataset_version__name__startswith=f"loop-{project.pk}-r"
        )
        .select_related("dataset_version")
        .first()
    )
    if run is None:
        raise NotFound("run_id: no such run of this project's loop.")
    return run


def loop_run_cancel(*, project: Project, run_id: int) -> TrainingRun:
    """Cancel a queued or running training run of the project's loop."""
    from training import services as training_services

    run = loop_run_for(project=project, run_id=run_id)
    return training_services.training_run_cancel(run_id=run.pk)


def loop_policy_for(*, project: Project, version_id: int, user) -> ModelVersion:
    """Return a model version of the project that the user may decide on; NotFound otherwise."""
    from training.selectors import model_version_list, model_version_project_id

    version = model_version_list(user=user).filter(pk=version_id).first()
    if version is None or model_version_project_id(version=version) != project.pk:
        raise NotFound("No such model version in this project.")
    return version


def loop_policy_decide(*, version: ModelVersion, user, promote: bool, reason: str) -> ModelVersion:
    """Promote or reject a policy by hand (the gate's own rules, `training.loop.gate`)."""
    from training.loop.gate import policy_promote, policy_reject

    decide = policy_promote if promote else policy_reject
    return decide(version=version, user=user, reason=reason)
