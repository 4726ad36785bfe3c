"""Dataset snapshots: create, build, fail, load and serve a DatasetVersion's files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from annotation.errors import ServiceError
from annotation.exports.pipeline import ExportResult, export_rows
from annotation.exports.policy import ExportPolicy
from annotation.exports.writer import (
    dataset_root,
    file_sha256,
    make_read_only,
    remove_tree,
    write_hf_folder,
)
from annotation.models import (
    DatasetVersion,
    Project,
)
from training.trainers.data import MANIFEST, SPLITS, data_hash


@transaction.atomic
def dataset_version_create(
    *, project: Project, policy: dict | ExportPolicy | None = None, name: str = "", user=None
) -> DatasetVersion:
    """Record a new export (status building) under the project's next version number."""
    if not isinstance(policy, ExportPolicy):
        policy = ExportPolicy.from_dict(policy)
    Project.objects.select_for_update().filter(pk=project.pk).first()
    last = DatasetVersion.objects.filter(project=project).order_by("-version").first()
    return DatasetVersion.objects.create(
        project=project,
        version=(last.version + 1) if last else 1,
        name=name,
        format=policy.format,
        policies=policy.policies(),
        filters=policy.filters(),
        created_by=user,
    )


def _policy_of(dataset_version: DatasetVersion) -> ExportPolicy:
    data = {**dataset_version.policies, **dataset_version.filters}
    return ExportPolicy.from_dict(data)


def dataset_version_build(
    *, dataset_version_id: int, progress: Callable[[int], None] | None = None
) -> DatasetVersion:
    """Write a building version's snapshot and mark it ready (or failed, with the error).

    Idempotent: a version that is not `building` is returned as it is. Two workers building
    the same version write to private folders; the first to finish publishes its folder.
    """
    with transaction.atomic():
        dv = (
            DatasetVersion.objects.select_for_update()
            .select_related("project")
            .get(pk=dataset_version_id)
        )
        if dv.status != DatasetVersion.Status.BUILDING:
            return dv
    project_dir = dataset_root() / str(dv.project_id)
    final = project_dir / str(dv.version)
    work = project_dir / f".{dv.version}.{uuid.uuid4().hex}.tmp"
    try:
        work.mkdir(parents=True)
        policy = _policy_of(dv)
        result = export_rows(project=dv.project, policy=policy, folder=work, progress=progress)
        if not result.split_counts["train"]:
            raise ServiceError(
                "no training rows: no judgment passed the filters and policies "
                f"(report: {json.dumps(result.report['judgments'])})",
                code="empty_export",
            )
        if policy.hf:
            write_hf_folder(work)
        content = _write_manifest(dv, result, work)
        return _publish(dataset_version_id, work=work, final=final, content=content, result=result)
    except (OperationalError, InterfaceError):
        remove_tree(work)  # transient: the task retries; the version stays `building`
        raise
    except Exception as exc:
        with contextlib.suppress(OSError):  # a full or read-only disk must not hide the cause
            remove_tree(work)
        if isinstance(exc, ServiceError):
            error = exc.message
        elif isinstance(exc, OSError):
            error = f"{_disk_problem(exc, project_dir)}\n{traceback.format_exc()}"
        else:
            error = traceback.format_exc()
        dataset_version_fail(dataset_version_id=dataset_version_id, error=error)
        raise


def _write_manifest(dv: DatasetVersion, result: ExportResult, work: Path) -> str:
    """Write ``manifest.json`` beside the split files; return their content hash."""
    content = data_hash(work)
    files = {p.name: file_sha256(p) for p in sorted(work.iterdir()) if p.name.endswith(".jsonl")}
    manifest = {
        "content_hash": content,
        "hash_method": "training.trainers.data.data_hash (sha256 of split files)",
        "project": {"id": dv.project_id, "name": dv.project.name},
        "version": dv.version,
        "name": dv.name,
        "format": dv.format,
        "kind": {"raw": "raw", "unpaired": "unpaired"}.get(dv.format, "preference"),
        "counts": result.split_counts,
        "side_files": result.side_counts,
        "files": files,
        "policies": dv.policies,
        "filters": dv.filters,
        "source_rounds": result.source_rounds,
        "report": result.report,
        "created_at": timezone.now().isoformat(),
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return content


def _publish(
    dataset_version_id: int, *, work: Path, final: Path, content: str, result: ExportResult
) -> DatasetVersion:
    """Move a finished folder into place and mark the version ready, unless another build won."""
    with transaction.atomic():
        dv = DatasetVersion.objects.select_for_update().get(pk=dataset_version_id)
        if dv.status != DatasetVersion.Status.BUILDING:
            remove_tree(work)
            return dv
        remove_tree(final)
        make_read_only(work)
        os.replace(work, final)
        dv.status = DatasetVersion.Status.READY
        dv.content_hash = content
        dv.split_counts = result.split_counts
        dv.source_rounds = result.source_rounds
        dv.report = {**result.report, "side_files": result.side_counts}
        dv.path = str(final)
        dv.finished_at = timezone.now()
        dv.save()
    return dv


def _disk_problem(exc: OSError, folder: Path) -> str:
    """Return a one-line reason why a snapshot could not be written under ``folder``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"Disk full: cannot write the snapshot under {folder}."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return f"The artefact folder {folder} is not writable: {exc.strerror or exc}."
    return f"Cannot write the snapshot under {folder}: {exc.strerror or exc}."


def dataset_version_fail(*, dataset_version_id: int, error: str) -> None:
    """Record a failed build (no-op for a version that is already ready)."""
    DatasetVersion.objects.filter(
        pk=dataset_version_id, status=DatasetVersion.Status.BUILDING
    ).update(status=DatasetVersion.Status.FAILED, error=error[-20000:], finished_at=timezone.now())


def dataset_version_export(
    *,
    project: Project,
    policy: dict | ExportPolicy | None = None,
    name: str = "",
    user=None,
    progress: Callable[[int], None] | None = None,
) -> DatasetVersion:
    """Create and build a snapshot now (management command, tests, small exports)."""
    dv = dataset_version_create(project=project, policy=policy, name=name, user=user)
    return dataset_version_build(dataset_version_id=dv.pk, progress=progress)


class SnapshotCorrupt(ServiceError):
    status = 500
    code = "snapshot_corrupt"


def dataset_version_load(*, dataset_version: DatasetVersion) -> dict[str, list[dict]]:
    """Return the rows of a ready snapshot per split, after checking its content hash."""
    folder = Path(dataset_version.path)
    if dataset_version.status != DatasetVersion.Status.READY or not folder.is_dir():
        raise ServiceError("the snapshot is not ready.", code="not_ready", status=409)
    if data_hash(folder) != dataset_version.content_hash:
        raise SnapshotCorrupt(f"{folder}: files do not match content hash")
    out = {}
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        if path.exists():
            with path.open(encoding="utf-8") as fh:
                out[split] = [json.loads(line) for line in fh if line.strip()]
    return out


def dataset_file_list(*, dataset_version: DatasetVersion) -> list[tuple[str, int]]:
    """Return ``(name, size in bytes)`` of each downloadable file of a ready snapshot, by name."""
    if dataset_version.status != DatasetVersion.Status.READY or not dataset_version.path:
        return []
    folder = Path(dataset_version.path)
    if not folder.is_dir():
        return []
    return sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file())


def dataset_file_path(*, dataset_version: DatasetVersion, name: str) -> Path:
    """Return the path of one file of a ready snapshot (a split, side file or manifest)."""
    if dataset_version.status != DatasetVersion.Status.READY:
        raise ServiceError("the snapshot is not ready.", code="not_ready", status=409)
    allowed = {file_name for file_name, _size in dataset_file_list(dataset_version=dataset_version)}
    if name not in allowed:
        raise ServiceError(f"no file {name!r} in this snapshot.", code="not_found", status=404)
    return Path(dataset_version.path) / name
