"""Console models pages: the project's versions with their validation, uploads by researchers,
folders by staff only, run versions named from the page, refusals that name the field and write
nothing, untrusted text escaped, and a table that stops polling once nothing is validating."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils.html import escape

from annotation.models import Membership
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and models)
    tiny_policy_dir,
    tiny_reward_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training import registry
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db


def _tar_gz(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(str(folder), arcname="model")
    return buffer.getvalue()


def _config_only(config: dict) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = json.dumps(config).encode()
        info = tarfile.TarInfo("config.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def world(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project, other = make_project(name="models project"), make_project(name="other")
    researcher, annotator, staff = make_user(), make_user(), make_user(staff=True)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    return {
        "project": project,
        "other": other,
        "researcher": researcher,
        "annotator": annotator,
        "staff": staff,
        "models_root": Path(settings.ARTIFACT_ROOT) / "models",
    }


def _url(name: str, world, *args) -> str:
    return reverse(f"console:{name}", args=[world["project"].pk, *args])


def _login(client, user):
    client.force_login(user)
    return client


def _upload(client, world, data: bytes, **fields):
    body = {
        "name": "page-upload",
        "kind": "policy",
        "prompt_format": "chat_template",
        "file": SimpleUploadedFile("model.tar.gz", data),
        **fields,
    }
    return client.post(_url("models-upload", world), body)


def test_the_nav_links_the_models_page_for_researchers(client, world):
    page = _login(client, world["researcher"]).get(
        reverse("console:project", args=[world["project"].pk])
    )
    assert _url("models", world) in page.content.decode()


def test_a_researcher_uploads_on_the_page_and_watches_it_validate(client, world, tiny_policy_dir):  # noqa: F811
    _login(client, world["researcher"])
    page = client.get(_url("models", world)).content.decode()
    assert "data-upload-form" in page and "data-folder-form" not in page

    response = _upload(client, world, _tar_gz(tiny_policy_dir))

    assert response.status_code == 302 and response["Location"] == _url("models", world)
    version = ModelVersion.objects.get(name="page-upload")
    assert version.status == "pending" and version.source == "upload"
    page = client.get(_url("models", world)).content.decode()
    assert 'hx-trigger="every' in page and 'data-status="pending"' in page
    table = client.get(_url("models-table", world))
    assert table.status_code == 200  # htmx keeps polling

    version = registry.model_version_validate(version_id=version.pk)
    table = client.get(_url("models-table", world))
    assert table.status_code == 286  # nothing is validating: htmx stops polling
    html = table.content.decode()
    assert 'data-status="ready"' in html
    assert str(version.validation["parameters"]) in html
    assert version.validation["hashes"]["weights"][:12] in html
    assert version.validation["dtype"] in html
    page = client.get(_url("models", world)).content.decode()
    assert 'hx-trigger="every' not in page


def test_a_bad_archive_is_refused_on_the_page_and_nothing_is_kept(client, world):
    _login(client, world["researcher"])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))

    response = _upload(client, world, buffer.getvalue())

    assert response.status_code == 400
    html = response.content.decode()
    assert re.search(r'data-field="file">file: unsafe archive', html)
    assert not ModelVersion.objects.exists()
    assert not world["models_root"].exists()


def test_a_taken_name_is_shown_under_the_name_field(client, world, tiny_policy_dir):  # noqa: F811
    ModelVersion.objects.create(name="page-upload", artifact_path=str(tiny_policy_dir))
    response = _upload(_login(client, world["researcher"]), world, _tar_gz(tiny_policy_dir))
    assert response.status_code == 400
    assert 'data-field="name">name: a model version named' in response.content.decode()
    assert ModelVersion.objects.count() == 1
    assert not world["models_root"].exists()


def test_an_oversized_upload_is_a_413(client, world, settings, tiny_policy_dir):  # noqa: F811
    data = _tar_gz(tiny_policy_dir)
    settings.PREFLOOP_MODEL_UPLOAD_MAX_BYTES = len(data) - 1
    response = _upload(_login(client, world["researcher"]), world, data)
    assert response.status_code == 413
    assert "PREFLOOP_MODEL_UPLOAD_MAX_BYTES" in response.content.decode()


def test_a_body_declared_past_the_limit_is_refused_before_it_is_read(client, world, settings):
    settings.PREFLOOP_MODEL_UPLOAD_MAX_BYTES = 1000
    response = _upload(_login(client, world["researcher"]), world, b"0" * (1 << 21))
    assert response.status_code == 413
    assert "PREFLOOP_MODEL_UPLOAD_MAX_BYTES" in response.content.decode()
    assert not ModelVersion.objects.exists()


def test_only_staff_register_a_folder(client, world, tiny_policy_dir):  # noqa: F811
    body = {
        "name": "from-folder",
        "kind": "policy",
        "prompt_format": "chat_template",
        "path": str(tiny_policy_dir),
    }
    refused = _login(client, world["researcher"]).post(_url("models-folder", world), body)
    assert refused.status_code == 403
    assert not ModelVersion.objects.exists()

    staff = _login(client, world["staff"])
    assert "data-folder-form" in staff.get(_url("models", world)).content.decode()
    outside = staff.post(_url("models-folder", world), {**body, "path": "/etc"})
    assert outside.status_code == 400
    assert (
        'data-field="path">path: outside the artefact and model roots' in outside.content.decode()
    )
    assert not ModelVersion.objects.exists()

    done = staff.post(_url("models-folder", world), body)
    assert done.status_code == 302
    version = ModelVersion.objects.get(name="from-folder")
    assert version.project == world["project"] and version.status == "pending"


def test_a_run_version_has_a_register_button_that_names_it(client, world, tiny_policy_dir):  # noqa: F811
    run = TrainingRun.objects.create(recipe="sft", project=world["project"], status="succeeded")
    trained = ModelVersion.objects.create(
        name=f"sft-run-{run.pk}", artifact_path=str(tiny_policy_dir), training_run=run
    )
    uploaded = ModelVersion.objects.create(
        name="uploaded-one",
        artifact_path=str(tiny_policy_dir),
        project=world["project"],
        source="upload",
    )
    _login(client, world["researcher"])
    html = client.get(_url("models", world)).content.decode()
    register_url = _url("models-register", world, trained.pk)
    assert register_url in html
    assert _url("models-register", world, uploaded.pk) not in html

    response = client.post(
        register_url, {f"v{trained.pk}-name": "my-sft", f"v{trained.pk}-prompt_format": "plain"}
    )

    assert response.status_code == 302
    trained.refresh_from_db()
    assert (trained.name, trained.status) == ("my-sft", "pending")
    assert trained.validation == {"prompt_format": "plain"}
    taken = client.post(
        register_url,
        {f"v{trained.pk}-name": "uploaded-one", f"v{trained.pk}-prompt_format": "plain"},
    )
    assert taken.status_code == 302
    page = client.get(_url("models", world)).content.decode()
    assert "was not registered: name: a model version named" in page
    trained.refresh_from_db()
    assert trained.name == "my-sft"


def test_untrusted_text_from_a_config_is_escaped(client, world):
    hostile = '<img src=x onerror="alert(1)">Net'
    _login(client, world["researcher"])
    response = _upload(
        client,
        world,
        _config_only({"architectures": [hostile], "model_type": "gpt2"}),
        name="hostile",
    )
    assert response.status_code == 302
    version = registry.model_version_validate(version_id=ModelVersion.objects.get().pk)
    assert version.status == "failed" and hostile in version.validation_error

    html = client.get(_url("models", world)).content.decode()
    assert hostile not in html
    assert escape(hostile) in html


def test_other_projects_versions_are_not_found_and_annotators_are_refused(
    client,
    world,
    tiny_policy_dir,  # noqa: F811
):
    run = TrainingRun.objects.create(recipe="sft", project=world["other"], status="succeeded")
    theirs = ModelVersion.objects.create(
        name="theirs", artifact_path=str(tiny_policy_dir), training_run=run
    )
    _login(client, world["researcher"])
    assert "theirs" not in client.get(_url("models", world)).content.decode()
    for name in ("models-register", "models-validate"):
        response = client.post(_url(name, world, theirs.pk), {f"v{theirs.pk}-name": "mine"})
        assert response.status_code == 404
    theirs.refresh_from_db()
    assert (theirs.name, theirs.status) == ("theirs", "ready")

    _login(client, world["annotator"])
    assert client.get(_url("models", world)).status_code == 403
    assert _upload(client, world, b"x").status_code == 403
