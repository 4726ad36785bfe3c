"""The OpenAPI schema builds without warnings, so the docs page describes every endpoint."""

import pytest
from django.core.management import call_command


def test_openapi_schema_generates_without_warnings(tmp_path):
    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    text = (tmp_path / "schema.yml").read_text()
    for path in ("/api/projects/{project_id}/next/", "/api/assignments/{assignment_id}/submit/"):
        assert path in text


@pytest.mark.django_db
def test_token_endpoint_issues_a_token(client):
    from tests.factories import make_user

    make_user("tok", password="s3cret-pass")
    r = client.post("/api/auth/token/", {"username": "tok", "password": "s3cret-pass"})
    assert r.status_code == 200 and len(r.json()["token"]) == 40


def _schema(tmp_path) -> dict:
    import yaml

    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    return yaml.safe_load((tmp_path / "schema.yml").read_text())


@pytest.mark.parametrize(
    ("path", "component"),
    [
        ("/api/projects/{project_id}/import/", "ImportInput"),
        ("/api/projects/{project_id}/import-preferences/", "PreferenceImportInput"),
    ],
)
def test_uploads_are_declared_as_binary_multipart_parts(tmp_path, path, component):
    # the docs page offers a file picker only for a multipart part of format binary
    schema = _schema(tmp_path)
    body = schema["paths"][path]["post"]["requestBody"]["content"]
    assert list(body) == ["multipart/form-data"]
    assert body["multipart/form-data"]["schema"]["$ref"].endswith("/" + component)
    file_field = schema["components"]["schemas"][component]["properties"]["file"]
    assert file_field == {"type": "string", "format": "binary"}


def test_dataset_versions_declare_their_files(tmp_path):
    schema = _schema(tmp_path)
    files = schema["components"]["schemas"]["DatasetVersionOutput"]["properties"]["files"]
    assert files["type"] == "array"
    item = schema["components"]["schemas"]["DatasetFileOutput"]
    assert set(item["properties"]) == {"name", "size", "url"}


@pytest.mark.django_db
def test_every_export_response_lists_its_files_with_working_links(tmp_path, settings):
    from rest_framework.test import APIClient

    from annotation.models import Judgment, Membership
    from tests.factories import add_member, make_items, make_project, make_user

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project()
    annotator, researcher = make_user(), make_user()
    add_member(project, annotator)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    for item in make_items(project, 4):
        Judgment.objects.create(project=project, item=item, annotator=annotator, choice="A")
    client = APIClient()
    client.force_authenticate(researcher)
    base = f"/api/projects/{project.pk}/datasets"
    policy = {"split": {"train": 1.0}, "hf": False}
    created = client.post(f"{base}/", {"sync": True, "policy": policy}, format="json").json()
    listed = client.get(f"{base}/").json()[0]
    detail = client.get(f"{base}/1/").json()
    for answer in (created, listed, detail):
        names = [f["name"] for f in answer["files"]]
        assert names == ["manifest.json", "train.jsonl"]
    for listed_file in detail["files"]:
        download = client.get(listed_file["url"])
        assert download.status_code == 200
        assert len(b"".join(download.streaming_content)) == listed_file["size"] > 0
