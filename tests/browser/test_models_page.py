"""In Chromium, with the mouse: a researcher uploads a model archive on the Models page and
names a version a run produced; a real Celery worker validates both, and the table shows
each verdict without a reload. No dialog opens and no CSP rule is broken."""

from __future__ import annotations

import io
import shutil
import tarfile
import uuid

import pytest
import redis
from django.conf import settings as django_settings

from annotation.models import Membership
from tests.browser.conftest import login, screenshot
from tests.celery_worker import Worker
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and model)
    tiny_policy_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training.models import ModelVersion, TrainingRun

pytestmark = [pytest.mark.celery, pytest.mark.slow]


def _tar_gz(folder) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(str(folder), arcname="my-policy")
    return buffer.getvalue()


def test_a_researcher_uploads_and_registers_models_with_the_mouse(
    make_page,
    live_server,
    settings,
    tmp_path,
    tiny_policy_dir,  # noqa: F811
):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(name="byo models")
    researcher = make_user("models-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    run = TrainingRun.objects.create(recipe="sft", project=project, status="succeeded")
    trained_folder = tmp_path / "run-final"
    shutil.copytree(tiny_policy_dir, trained_folder)
    trained = ModelVersion.objects.create(
        name=f"sft-run-{run.pk}", artifact_path=str(trained_folder), training_run=run
    )
    archive = tmp_path / "my-policy.tar.gz"
    archive.write_bytes(_tar_gz(tiny_policy_dir))
    # The worker listens where the validation task is sent (the CPU workers' queue).
    from training.tasks import validate_model_version

    queue = validate_model_version.queue
    redis.Redis.from_url(django_settings.CELERY_BROKER_URL).delete(queue)
    worker = Worker(
        queue=queue,
        broker_url=django_settings.CELERY_BROKER_URL,
        log_path=tmp_path / "worker.log",
        name=f"models-{uuid.uuid4().hex[:8]}",
    )
    recorder = make_page(width=1280, height=900)
    page = recorder.page
    try:
        login(recorder, live_server, researcher.username)
        page.goto(f"{live_server.url}/console/projects/{project.pk}/")
        page.get_by_role("link", name="Models").click()
        page.wait_for_selector(f"tr[data-version='{trained.pk}']")

        # upload: fill the form by clicking into its fields, pick the archive, click Upload
        upload = page.locator("form[data-upload-form]")
        upload.get_by_label("Name", exact=True).click()
        page.keyboard.type("my-policy")
        upload.get_by_label("File").set_input_files(str(archive))
        upload.get_by_role("button", name="Upload and validate").click()
        page.wait_for_selector("text=my-policy uploaded; it is being validated.")
        uploaded = ModelVersion.objects.get(name="my-policy")
        row = page.locator(f"tr[data-version='{uploaded.pk}']")
        assert row.get_attribute("data-status") in ("pending", "validating", "ready")
        page.evaluate("window.__notReloaded = true")

        # the worker validates it and the polled table shows it, without a reload
        page.wait_for_selector(
            f"tr[data-version='{uploaded.pk}'][data-status='ready']", timeout=180_000
        )
        assert page.evaluate("window.__notReloaded") is True
        uploaded.refresh_from_db()
        text = page.locator(f"tr[data-version='{uploaded.pk}']").inner_text()
        assert str(uploaded.validation["parameters"]) in text
        assert uploaded.validation["hashes"]["weights"][:12] in text
        screenshot(page, "models-page-uploaded")

        # register the run's version: a new name, then the Register button
        form = page.locator(f"tr[data-version='{trained.pk}'] form[data-register-form]")
        name = form.locator("input[type=text]")
        name.click()
        name.press("Control+a")
        page.keyboard.type("my-sft-v1")
        form.get_by_role("button", name="Register").click()
        page.wait_for_selector("text=my-sft-v1 registered; it is being validated.")
        page.wait_for_selector(
            f"tr[data-version='{trained.pk}'][data-status='ready']", timeout=180_000
        )
        trained.refresh_from_db()
        assert trained.name == "my-sft-v1" and trained.validation["hashes"]["weights"]
        assert "my-sft-v1" in page.locator(f"tr[data-version='{trained.pk}']").inner_text()
        screenshot(page, "models-page-registered")
        recorder.assert_clean()
    finally:
        worker.stop()
        redis.Redis.from_url(django_settings.CELERY_BROKER_URL).delete(queue)
