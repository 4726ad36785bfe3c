"""In Chromium: the prompt pool page with the mouse. A file chosen through the file chooser is
imported (its counts shown, every bad line of a bad file listed), and "Generate the round"
queues a job that a real Celery worker on the gpu queue runs while the page shows its progress
and then the open round, without a reload."""

from __future__ import annotations

import json
import uuid

import pytest
from django.conf import settings as django_settings

from annotation.models import Membership, Prompt
from tests.browser.conftest import login, screenshot
from tests.celery_worker import Worker
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and policy)
    tiny_policy_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training.models import GenerationJob, ModelVersion

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

HOSTILE = '<img src=x onerror=alert("pool")>'


def _choose_file(page, path) -> None:
    """Open the form's file chooser with a click and pick the file, as a person would."""
    with page.expect_file_chooser() as chooser:
        page.locator("#pool-upload-form input[type=file]").click()
    chooser.value.set_files(str(path))


def test_upload_and_generate_a_round_with_the_mouse(
    make_page,
    live_server,
    tmp_path,
    tiny_policy_dir,  # noqa: F811
):
    import redis

    project = make_project(name="pool page browser", k=2)
    add_member(project, make_user("pool-researcher"), Membership.Role.RESEARCHER)
    policy = ModelVersion.objects.create(
        name="tiny-browser-policy", artifact_path=str(tiny_policy_dir), project=project
    )
    broker = django_settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).delete("gpu")
    good = tmp_path / "pool.jsonl"
    rows = [{"prompt": f"What is {i} + {i}?", "tags": ["math"]} for i in range(5)]
    rows.append({"messages": [{"role": "user", "content": HOSTILE}], "tags": ["chat"]})
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": ""}\nnot json\n')

    recorder = make_page(width=1280, height=900)
    page = recorder.page
    login(recorder, live_server, "pool-researcher")
    page.goto(f"{live_server.url}/console/projects/{project.pk}/")
    page.get_by_role("link", name="Prompts").click()
    page.wait_for_selector("h1:has-text('Prompt pool')")

    # A bad file: every bad line listed, nothing imported
    _choose_file(page, bad)
    page.get_by_role("button", name="Import prompts").click()
    page.wait_for_selector("#pool-upload-result .bad-lines")
    lines = page.locator("#pool-upload-result .bad-lines tbody tr td:first-child").all_inner_texts()
    assert lines == ["2", "3"]
    assert not Prompt.objects.filter(project=project).exists()

    # A good file, with the eval share typed: counts shown
    _choose_file(page, good)
    page.get_by_label("Eval fraction").fill("0")
    page.get_by_role("button", name="Import prompts").click()
    page.wait_for_selector("#pool-upload-result [data-report=added]")
    assert page.locator("#pool-upload-result [data-report=added]").inner_text() == "6"
    assert Prompt.objects.filter(project=project, in_pool=True, split="train").count() == 6

    # The page again: counts, tags, the hostile prompt shown as text
    page.reload()
    assert page.locator('[data-count="train"]').inner_text() == "6"
    assert page.locator('[data-tag="math"]').count() == 1
    assert HOSTILE in page.locator(".pool-prompts").inner_text()

    # Generate a round with the mouse; the job waits in the queue with its progress shown
    page.get_by_label("tiny-browser-policy").check()
    page.get_by_label("Prompts", exact=True).fill("4")
    page.get_by_label("Temperature").fill("1.2")
    page.get_by_label("Max new tokens").fill("8")
    page.get_by_role("button", name="Generate the round").click()
    job_box = page.locator("#pool-generate-result .generation-job")
    job_box.wait_for()
    assert job_box.locator("[data-job-status]").inner_text() == "queued"
    assert job_box.locator("progress").count() == 1
    job = GenerationJob.objects.get(project=project)
    assert list(job.policies.values_list("pk", flat=True)) == [policy.pk]
    page.evaluate("window.__notReloaded = true")

    worker = Worker(
        queue="gpu", broker_url=broker, log_path=tmp_path / "worker.log", name=uuid.uuid4().hex
    )
    try:
        page.wait_for_function(
            "() => document.querySelector('#pool-generate-result [data-job-status]')"
            ".textContent === 'succeeded'",
            timeout=180_000,
        )
    finally:
        worker.stop()
    result = page.locator("#pool-generate-result")
    assert result.locator("[data-percent]").inner_text() == "100%"
    job.refresh_from_db()
    assert job.status == "succeeded" and job.round.items.count() == job.n_items > 0
    assert f"Round {job.round.number} is open with {job.n_items} item(s)." in result.inner_text()
    assert page.evaluate("window.__notReloaded") is True
    screenshot(page, "console-pool-1280")
    recorder.assert_clean()
