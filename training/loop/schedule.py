"""A project's loop on a django-celery-beat schedule: set, pause, resume, read."""

from __future__ import annotations

import json

from annotation.models import Project
from training.loop.settings import LoopSettings

LOOP_TASK = "training.loop_tasks.loop_tick"


def loop_schedule_set(
    *, project: Project, settings: LoopSettings, every_seconds: int = 60, enabled: bool = True
):
    """Create or update the project's beat schedule that ticks its loop."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every_seconds, period=IntervalSchedule.SECONDS
    )
    task, _ = PeriodicTask.objects.update_or_create(
        name=f"prefloop-loop-{project.pk}",
        defaults={
            "task": LOOP_TASK,
            "interval": interval,
            "kwargs": json.dumps({"project_id": project.pk, "settings": settings.to_dict()}),
            "enabled": enabled,
        },
    )
    return task


def loop_schedule_pause(*, project: Project, paused: bool = True) -> bool:
    """Pause (or resume) the project's loop schedule; return whether one exists."""
    from django_celery_beat.models import PeriodicTask

    return bool(
        PeriodicTask.objects.filter(name=f"prefloop-loop-{project.pk}").update(enabled=not paused)
    )


def loop_schedule_paused(*, project_id: int) -> bool:
    """Return whether the project has a loop schedule and it is paused."""
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.filter(name=f"prefloop-loop-{project_id}", enabled=False).exists()
