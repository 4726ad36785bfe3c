"""A project's loop on a django-celery-beat schedule: set, pause, resume, read.

The schedule carries only the project id. The settings and the pause flag live on the
project's `training.Loop` row (`training.loop.control`); the schedule's `enabled` flag follows
that pause flag so beat does not even send ticks while paused, and a tick already queued reads
`Loop.paused` and does nothing.
"""

from __future__ import annotations

import json

from annotation.models import Project

LOOP_TASK = "training.loop_tasks.loop_tick"


def loop_schedule_name(project_id: int) -> str:
    """Return the name of the project's beat schedule."""
    return f"prefloop-loop-{project_id}"


def loop_schedule_set(*, project: Project, every_seconds: int = 60, enabled: bool = True):
    """Create or update the project's beat schedule that ticks its loop."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every_seconds, period=IntervalSchedule.SECONDS
    )
    task, _ = PeriodicTask.objects.update_or_create(
        name=loop_schedule_name(project.pk),
        defaults={
            "task": LOOP_TASK,
            "interval": interval,
            "kwargs": json.dumps({"project_id": project.pk}),
            "enabled": enabled,
        },
    )
    return task


def loop_schedule_get(*, project_id: int):
    """Return the project's beat schedule, or None."""
    from django_celery_beat.models import PeriodicTask

    return (
        PeriodicTask.objects.select_related("interval")
        .filter(name=loop_schedule_name(project_id))
        .first()
    )


def loop_schedule_pause(*, project: Project, paused: bool = True) -> bool:
    """Disable (or enable) the project's beat schedule; return whether one exists."""
    from django_celery_beat.models import PeriodicTask

    return bool(
        PeriodicTask.objects.filter(name=loop_schedule_name(project.pk)).update(enabled=not paused)
    )


def loop_schedule_paused(*, project_id: int) -> bool:
    """Return whether the project's loop is paused (its `Loop.paused` flag)."""
    from training.models import Loop

    return Loop.objects.filter(project_id=project_id, paused=True).exists()
