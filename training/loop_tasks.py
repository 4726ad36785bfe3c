"""Celery tasks of the loop: a beat tick per project, and round generation on the gpu queue."""

from celery import shared_task

from training import loop


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def loop_tick(project_id: int, settings: dict) -> list[tuple[str, str, str]]:
    """Advance the project's loop iteration as far as it can go now.

    A tick queued before a researcher paused the schedule finds it paused and does nothing.
    """
    from annotation.models import Project

    if loop.loop_schedule_paused(project_id=project_id):
        return [("tick", "skipped", "the project's loop schedule is paused")]
    project = Project.objects.get(pk=project_id)
    state = loop.loop_advance(project=project, settings=loop.LoopSettings.from_dict(settings))
    return [(s.name, s.status, s.detail) for s in state.steps]


@shared_task(queue="gpu", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def generate_round(project_id: int, model_version_id: int, source_key: str, settings: dict):
    """Generate the round keyed by source_key; a redelivered task finds it and stops."""
    loop.generate_round_now(
        project_id=project_id,
        model_version_id=model_version_id,
        source_key=source_key,
        settings=settings,
    )
