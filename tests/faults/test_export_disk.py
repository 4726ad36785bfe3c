"""A dataset snapshot that cannot be written fails its version clearly and publishes nothing.

The training side (unwritable folder, full disk) is covered by
tests/training/test_runs.py; these are the export snapshot folder's cases. Tests may run as
root, which ignores permission bits, so "unwritable" is made real in ways root cannot
bypass: a file where the folder must be, and a read-only mount. "Disk full" is a tiny tmpfs
filled to the last byte (mounting needs root; the test is skipped without it).
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

from annotation import exports, tasks
from annotation.models import DatasetVersion, Judgment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

POLICY = {"split": {"train": 1.0}, "hf": False}


@pytest.fixture
def labelled_project():
    project = make_project()
    annotator = make_user()
    add_member(project, annotator)
    for item in make_items(project, 6):
        Judgment.objects.create(project=project, item=item, annotator=annotator, choice="A")
    return project


@pytest.fixture
def mount_tmpfs(tmp_path):
    """Return ``mount(path, options)``: a private tmpfs there, unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _entries(folder: Path) -> list[str]:
    """Return every path under ``folder`` (relative), or [] when it does not exist."""
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _assert_failed_cleanly(version: DatasetVersion, *, error_start: str, where: Path) -> None:
    version.refresh_from_db()
    assert version.status == DatasetVersion.Status.FAILED
    assert version.error.startswith(error_start), version.error[:500]
    assert str(where) in version.error.splitlines()[0]
    assert version.finished_at is not None
    # nothing half-published: no path, no hash, no counts
    assert version.path == "" and version.content_hash == "" and version.split_counts == {}


def test_export_into_a_folder_that_cannot_exist_fails_clearly(labelled_project, tmp_path, settings):
    # given an artefact root that is a file (no one, root included, can create folders in it)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.ARTIFACT_ROOT = blocker

    # when a snapshot is built
    version = exports.dataset_version_create(project=labelled_project, policy=POLICY)
    with pytest.raises(OSError):
        exports.dataset_version_build(dataset_version_id=version.pk)

    # then the version failed with a clear first line naming the folder
    _assert_failed_cleanly(version, error_start="The artefact folder", where=blocker)
    assert "is not writable" in version.error.splitlines()[0]
    assert blocker.read_text() == ""


def test_export_onto_a_read_only_filesystem_fails_clearly(
    labelled_project, tmp_path, settings, mount_tmpfs
):
    root = mount_tmpfs(tmp_path / "ro", "ro,size=1m")
    settings.ARTIFACT_ROOT = root

    version = exports.dataset_version_create(project=labelled_project, policy=POLICY)
    with pytest.raises(OSError):
        exports.dataset_version_build(dataset_version_id=version.pk)

    _assert_failed_cleanly(version, error_start="The artefact folder", where=root)
    assert _entries(root) == []


def test_export_onto_a_full_disk_fails_clearly_and_leaves_no_partial_snapshot(
    labelled_project, tmp_path, settings, mount_tmpfs
):
    # given an artefact disk with no byte left (the project's folder already exists on it)
    root = mount_tmpfs(tmp_path / "small", "size=64k")
    settings.ARTIFACT_ROOT = root
    (root / "datasets" / str(labelled_project.pk)).mkdir(parents=True)
    with (root / "filler").open("wb", buffering=0) as filler, pytest.raises(OSError) as full:
        while True:
            filler.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    before = _entries(root)

    # when the export task builds a snapshot
    version = exports.dataset_version_create(project=labelled_project, policy=POLICY)
    result = tasks.build_dataset_version.apply(args=(version.pk,))

    # then the task failed, the version says "Disk full" and no snapshot folder is left
    assert result.failed()
    _assert_failed_cleanly(version, error_start="Disk full", where=root)
    assert _entries(root) == before


def test_a_failed_export_does_not_block_the_next_one(labelled_project, tmp_path, settings):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.ARTIFACT_ROOT = blocker
    failed = exports.dataset_version_create(project=labelled_project, policy=POLICY)
    with pytest.raises(OSError):
        exports.dataset_version_build(dataset_version_id=failed.pk)

    # once the folder is fixed, a new export gets the next version number and is ready
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    ready = exports.dataset_version_export(project=labelled_project, policy=POLICY)
    assert ready.status == DatasetVersion.Status.READY
    assert ready.version == failed.version + 1
    assert Path(ready.path).is_dir() and ready.split_counts["train"] == 6
    failed.refresh_from_db()
    assert failed.status == DatasetVersion.Status.FAILED


def test_a_synchronous_export_over_the_api_says_what_went_wrong(
    labelled_project, tmp_path, settings
):
    from rest_framework.test import APIClient

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.ARTIFACT_ROOT = blocker
    client = APIClient()
    client.force_authenticate(make_user(staff=True))

    response = client.post(
        f"/api/projects/{labelled_project.pk}/datasets/",
        {"policy": POLICY, "sync": True},
        format="json",
    )

    assert response.status_code == 507, response.content
    body = response.json()
    assert body["code"] == "storage" and body["detail"].startswith("The artefact folder")
    assert str(blocker) in body["detail"]
    assert body["dataset_version"]["status"] == DatasetVersion.Status.FAILED
    _assert_failed_cleanly(
        DatasetVersion.objects.get(pk=body["dataset_version"]["id"]),
        error_start="The artefact folder",
        where=blocker,
    )
