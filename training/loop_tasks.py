"""Celery tasks of the loop: a beat tick per project; generation and evaluation on the gpu queue."""

from celery import shared_task

from training import loop


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def loop_tick(
    project_id: int, settings: dict | None = None, force: bool = False
) -> list[tuple[str, str, str]]:
    """Advance the project's loop as far as it can go now, recording every step and the outcome.

    Settings and the pause flag come from the project's `Loop` row: a tick queued before a
    researcher paused the loop does nothing. `settings` is read only from beat schedules
    written before the row existed, to create it. A tick that raises is recorded on the row
    with its traceback, then re-raised.
    """
    from training.loop import control
    from training.models import Loop

    if settings is not None and not Loop.objects.filter(project_id=project_id).exists():
        from annotation.models import Project

        control.loop_create(project=Project.objects.get(pk=project_id), settings=settings)
    state = control.loop_tick_run(project_id=project_id, force=force)
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


@shared_task(queue="gpu", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def evaluate_policy(project_id: int, policy_id: int, settings: dict):
    """Run the loop's evaluation of a new policy; an evaluated policy is left alone."""
    from training.policy_eval import policy_evaluation_run

    policy_evaluation_run(project_id=project_id, policy_id=policy_id, settings=settings)
