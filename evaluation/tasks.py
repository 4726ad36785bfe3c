"""Celery tasks of quality control: each takes ids, loads the rows and calls one service."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from annotation.models import Project
from evaluation import selectors, services
from evaluation.models import AnnotatorAssessment

RETRY = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 5,
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": 5,
}


@shared_task(
    queue="default", acks_late=True, reject_on_worker_lost=True, ignore_result=True, **RETRY
)
def qc_check_annotator_task(project_id: int, annotator_id: int) -> int:
    """Assess one annotator (pausing per the project's policy); return how many were paused."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return 0
    result = services.qc_check_annotator(
        project=project, annotator_id=annotator_id, trigger=AnnotatorAssessment.Trigger.AUTO
    )
    return len(result.paused)


@shared_task(
    queue="default", acks_late=True, reject_on_worker_lost=True, ignore_result=True, **RETRY
)
def qc_check_project_task(project_id: int, trigger: str = AnnotatorAssessment.Trigger.API) -> int:
    """Assess every annotator, mark disputed items and store an agreement report."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return 0
    enabled = selectors.quality_policy_get(project=project).enabled
    result = services.qc_check_project(project=project, pause=enabled, trigger=trigger)
    return len(result.paused)
