"""Reads of training runs and the model registry, with who may see what."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from annotation.models import Membership
from training.models import ModelVersion, TrainingRun


def user_is_researcher(*, user) -> bool:
    """Return whether the user may use training at all (staff, or a researcher somewhere)."""
    if not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    return Membership.objects.filter(user=user, role=Membership.Role.RESEARCHER).exists()


def _researched_project_ids(user) -> QuerySet:
    return Membership.objects.filter(user=user, role=Membership.Role.RESEARCHER).values(
        "project_id"
    )


def training_run_list(*, user, project_id: int | None = None, status: str = "") -> QuerySet:
    """Return the runs the user may see: all for staff, their researched projects' otherwise."""
    runs = TrainingRun.objects.select_related("project", "dataset_version", "base_model")
    if not user.is_staff:
        runs = runs.filter(project_id__in=_researched_project_ids(user))
    if project_id is not None:
        runs = runs.filter(project_id=project_id)
    if status:
        # A value no run can have (a NUL byte included, which PostgreSQL refuses) finds none.
        runs = runs.filter(status=status) if status in TrainingRun.Status.values else runs.none()
    return runs.order_by("-created_at", "-pk")


def training_run_get(*, user, run_id: int) -> TrainingRun | None:
    """Return one run the user may see, or None."""
    return training_run_list(user=user).filter(pk=run_id).first()


def model_version_list(*, user, kind: str = "") -> QuerySet:
    """Return registry entries the user may see, with their lineage loaded."""
    versions = ModelVersion.objects.select_related(
        "parent", "training_run", "training_run__project", "dataset_version"
    )
    if not user.is_staff:
        projects = _researched_project_ids(user)
        versions = versions.filter(
            Q(training_run__project_id__in=projects)
            | Q(dataset_version__project_id__in=projects)
            | Q(project_id__in=projects)
        )
    if kind:
        # A value no version can have (a NUL byte included, which PostgreSQL refuses) finds none.
        kinds = ModelVersion.Kind.values
        versions = versions.filter(kind=kind) if kind in kinds else versions.none()
    return versions.order_by("-created_at", "-pk")


def model_version_list_for_project(*, project_id: int) -> QuerySet:
    """Return a project's registry entries: its runs', its datasets' and its own registered ones.

    The same three ways as ``model_version_project_id``, as a query.
    """
    versions = ModelVersion.objects.select_related("training_run", "dataset_version")
    return versions.filter(
        Q(training_run__project_id=project_id)
        | Q(training_run__project_id__isnull=True, dataset_version__project_id=project_id)
        | Q(
            training_run__project_id__isnull=True,
            dataset_version__isnull=True,
            project_id=project_id,
        )
    ).order_by("-created_at", "-pk")


def model_version_lineage(*, version: ModelVersion) -> list[ModelVersion]:
    """Return the version and its ancestors, newest first (stops on a cycle)."""
    chain, seen = [], set()
    current = version
    while current is not None and current.pk not in seen:
        chain.append(current)
        seen.add(current.pk)
        current = current.parent
    return chain


def model_version_project_id(*, version: ModelVersion) -> int | None:
    """Return the project a registered model belongs to (its run's, dataset's, or own)."""
    if version.training_run is not None and version.training_run.project_id:
        return version.training_run.project_id
    if version.dataset_version is not None:
        return version.dataset_version.project_id
    return version.project_id


def dataset_version_for_user(*, user, dataset_version_id: int):
    """Return a dataset version the user may train on (staff: any), or None."""
    from annotation.models import DatasetVersion

    versions = DatasetVersion.objects.select_related("project")
    if not user.is_staff:
        versions = versions.filter(project_id__in=_researched_project_ids(user))
    return versions.filter(pk=dataset_version_id).first()
