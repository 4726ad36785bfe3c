"""Import/export endpoints, the Celery hand-off and the management commands."""

import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from rest_framework.test import APIClient

from annotation import tasks
from annotation.models import DatasetVersion, Judgment, Membership
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _artifacts(tmp_path, settings):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


@pytest.fixture
def setup():
    project = make_project()
    annotator, researcher = make_user(), make_user()
    add_member(project, annotator)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    for item in make_items(project, 4):
        Judgment.objects.create(project=project, item=item, annotator=annotator, choice="A")
    return project, annotator, researcher


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _upload(rows, name="prefs.jsonl") -> SimpleUploadedFile:
    body = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    return SimpleUploadedFile(name, body.encode(), content_type="application/octet-stream")


def test_annotators_cannot_export_or_import(setup):
    project, annotator, _ = setup
    client = _client(annotator)
    base = f"/api/projects/{project.pk}"
    assert client.get(f"{base}/datasets/").status_code == 403
    assert client.post(f"{base}/datasets/", {}, format="json").status_code == 403
    assert client.post(f"{base}/import-preferences/").status_code == 403


def test_researcher_exports_synchronously_and_downloads_the_files(setup):
    project, _, researcher = setup
    client = _client(researcher)
    base = f"/api/projects/{project.pk}/datasets"
    body = {"name": "first", "sync": True, "policy": {"split": {"train": 1.0}, "hf": False}}
    response = client.post(f"{base}/", body, format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["status"] == "ready" and data["split_counts"]["train"] == 4
    assert client.get(f"{base}/").json()[0]["version"] == 1
    assert client.get(f"{base}/1/").json()["content_hash"] == data["content_hash"]
    download = client.get(f"{base}/1/files/train.jsonl")
    assert download.status_code == 200
    lines = b"".join(download.streaming_content).decode().splitlines()
    assert len(lines) == 4 and "chosen" in json.loads(lines[0])
    assert client.get(f"{base}/1/files/..%2Fsecret").status_code == 404
    manifest = json.loads(b"".join(client.get(f"{base}/1/files/manifest.json").streaming_content))
    assert manifest["content_hash"] == data["content_hash"]


def test_bad_policy_is_a_400(setup):
    project, _, researcher = setup
    response = _client(researcher).post(
        f"/api/projects/{project.pk}/datasets/", {"policy": {"ties": "?"}}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "invalid_policy"


def test_async_export_is_queued_after_commit(
    setup, monkeypatch, django_capture_on_commit_callbacks
):
    project, _, researcher = setup
    queued = []
    monkeypatch.setattr(tasks.build_dataset_version, "delay", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        response = _client(researcher).post(
            f"/api/projects/{project.pk}/datasets/", {"policy": {"hf": False}}, format="json"
        )
    assert response.status_code == 202
    dv = DatasetVersion.objects.get()
    assert queued == [dv.pk] and dv.status == "building"
    # The task body builds it; a second delivery leaves the ready version alone.
    assert tasks.build_dataset_version(dv.pk) == "ready"
    assert tasks.build_dataset_version(dv.pk) == "ready"


def test_task_failure_hook_marks_the_version_failed(setup):
    project, *_ = setup
    dv = DatasetVersion.objects.create(project=project, version=9)
    tasks.ExportTask().on_failure(RuntimeError("boom"), "t", (dv.pk,), {}, "traceback")
    dv.refresh_from_db()
    assert dv.status == "failed" and "boom" in dv.error


def test_import_endpoint_reports_every_bad_line(setup):
    project, _, researcher = setup
    client = _client(researcher)
    bad = _upload(
        [
            {"prompt": "p", "chosen": "a", "rejected": "b"},
            "{oops",
            {"prompt": "p2", "chosen": "a"},
        ]
    )
    response = client.post(
        f"/api/projects/{project.pk}/import-preferences/", {"file": bad, "format": "trl"}
    )
    assert response.status_code == 400
    assert [e["line"] for e in response.json()["errors"]] == [2, 3]
    good = _upload([{"prompt": "p", "chosen": "a", "rejected": "b"}])
    response = client.post(
        f"/api/projects/{project.pk}/import-preferences/", {"file": good, "format": "trl"}
    )
    assert response.status_code == 201 and response.json()["judgments_created"] == 1


def test_commands_import_then_export(setup, tmp_path):
    project, *_ = setup
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad"} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = io.StringIO()
    call_command(
        "import_preferences", str(project.pk), str(path), "--format", "trl", "--no-progress",
        stdout=out,
    )  # fmt: skip
    assert '"judgments_created": 5' in out.getvalue()
    out = io.StringIO()
    call_command(
        "export_dataset", project.name, "--sources", "human,imported", "--split", "1",
        "--no-hf", "--no-progress", "--aggregation", "majority", stdout=out,
    )  # fmt: skip
    dv = DatasetVersion.objects.get()
    assert dv.split_counts["train"] == 9 and dv.filters["sources"] == ["human", "imported"]


def test_import_items_command_reports_bad_lines(setup, tmp_path):
    project, *_ = setup
    path = tmp_path / "items.jsonl"
    path.write_text('{"prompt": "p", "candidates": ["a"]}\n')
    err = io.StringIO()
    with pytest.raises(Exception, match="bad line"):
        call_command("import_items", str(project.pk), str(path), stderr=err)
    assert "line 1: expected 2 candidates" in err.getvalue()
