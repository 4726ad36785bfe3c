"""In Chromium: the loop page driven with the mouse and by touch. "Run the next step" queues a
tick that a real Celery worker runs, and the polled timeline shows its outcome and a run's
progress without a reload; pause and resume, and a policy rejected with a reason by a tap."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings as django_settings

from annotation.models import DatasetVersion, Membership, Round
from tests.browser.conftest import login, screenshot
from tests.celery_worker import Worker
from tests.factories import add_member, make_items, make_project, make_user
from training.loop import control
from training.models import Loop, ModelVersion, TrainingRun

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def _world(tmp_path):
    project = make_project(name="loop page", k=2, overlap=1)
    researcher = make_user("loop-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    base = ModelVersion.objects.create(name="base", artifact_path=str(tmp_path), project=project)
    round1 = Round.objects.create(project=project, number=1, model_version=base)
    make_items(project, 2, round_=round1)
    dataset = DatasetVersion.objects.create(
        project=project,
        version=1,
        name=f"loop-{project.pk}-r1",
        status="ready",
        content_hash="b" * 64,
    )
    running = TrainingRun.objects.create(
        recipe="reward", project=project, dataset_version=dataset, status="running", progress=0.3
    )
    trained = TrainingRun.objects.create(
        recipe="dpo", project=project, dataset_version=dataset, status="succeeded", progress=1.0
    )
    policy = ModelVersion.objects.create(
        name="policy-r1",
        artifact_path=str(tmp_path),
        training_run=trained,
        dataset_version=dataset,
        parent=base,
    )
    control.loop_create(project=project, settings={"path": "dpo"})
    return project, running, policy


def test_the_loop_page_with_the_mouse_and_by_touch(make_page, live_server, tmp_path):
    import redis

    project, running, policy = _world(tmp_path)
    broker = django_settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).delete("default")
    url = f"{live_server.url}/console/projects/{project.pk}/loop/"

    # --- with the mouse ---
    recorder = make_page(width=1280, height=900)
    page = recorder.page
    login(recorder, live_server, "loop-researcher")
    page.goto(url)
    live = page.locator("#loop-live")
    assert live.locator("[data-loop-state]").inner_text() == "running"
    assert live.locator("[data-tick-status]").inner_text() == "–"
    assert "30%" in live.locator('[data-step="train"]').first.inner_text()

    page.get_by_role("button", name="Pause").click()
    page.wait_for_function(
        "() => document.querySelector('[data-loop-state]').textContent === 'paused'"
    )
    assert Loop.objects.get(project=project).paused
    page.get_by_role("button", name="Resume").click()
    page.wait_for_function(
        "() => document.querySelector('[data-loop-state]').textContent === 'running'"
    )
    assert not Loop.objects.get(project=project).paused

    # Run the next step: a real worker runs the tick; the polled timeline shows its outcome
    page.get_by_role("button", name="Run the next step now").click()
    page.wait_for_selector("text=Next step queued")
    page.evaluate("window.__notReloaded = true")
    worker = Worker(
        queue="default", broker_url=broker, log_path=tmp_path / "worker.log", name=uuid.uuid4().hex
    )
    try:
        page.wait_for_function(
            "() => document.querySelector('[data-tick-status]').textContent === 'done'",
            timeout=90_000,
        )
    finally:
        worker.stop()
    assert "round 1 needs more labels" in live.locator("[data-last-steps]").inner_text()
    # a run moves on: the polled timeline follows it without a reload
    TrainingRun.objects.filter(pk=running.pk).update(progress=0.8)
    page.wait_for_function(
        "() => document.querySelector('[data-step=\"train\"]').textContent.includes('80%')",
        timeout=20_000,
    )
    assert page.evaluate("window.__notReloaded") is True
    screenshot(page, "console-loop-1280")
    recorder.assert_clean()

    # --- by touch: the second action of each row (Pause; Reject with a reason) ---
    touch = make_page(width=390, height=844, has_touch=True, is_mobile=True)
    phone = touch.page
    login(touch, live_server, "loop-researcher")
    phone.goto(url)
    phone.locator("#loop-live .actions button").nth(1).tap()
    phone.wait_for_function(
        "() => document.querySelector('[data-loop-state]').textContent === 'paused'"
    )
    assert Loop.objects.get(project=project).paused
    decide = phone.locator(".loop-decide")
    decide.get_by_label("Reason").fill("answers got longer, not better")
    decide.locator("button").nth(1).tap()
    phone.wait_for_selector(f"text=Model version {policy.pk} rejected")
    policy.refresh_from_db()
    assert policy.promotion == "rejected"
    assert policy.promotion_reason == "answers got longer, not better"
    assert "answers got longer, not better" in phone.locator('[data-step="gate"]').inner_text()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(phone, "console-loop-390")
    touch.assert_clean()
