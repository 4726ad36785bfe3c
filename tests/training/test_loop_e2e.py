"""Two rounds of the loop with a real Celery worker on Redis and simulated annotators over HTTP.

round 1 (tiny policy's answers) -> simulated annotators label it through the REST API ->
loop tick: export -> DPO on the gpu queue -> evaluate -> generate round 2 -> label round 2 ->
loop tick again -> round 3 opens from the second policy. Every step runs in the worker; the
test only sends ticks and watches the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from annotation.models import DatasetVersion, Judgment, Project, Round
from annotation.services import simulated_annotator_ensure
from annotation.simulation import PRESETS, run_pool
from training import demo, loop
from training.loop_tasks import generate_round, loop_tick
from training.models import ModelVersion, TrainingRun

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"

pytestmark = [pytest.mark.celery, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Worker:
    """A `celery worker` subprocess on the test broker and the pytest-django test database."""

    def __init__(self, log_path: Path, artifacts: Path):
        db = connection.settings_dict
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": f"postgres://{db.get('USER') or 'postgres'}@"
            f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}",
            "CELERY_BROKER_URL": django_settings.CELERY_BROKER_URL,
            "PREFLOOP_ARTIFACT_ROOT": str(artifacts),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                "gpu,default",
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=str(django_settings.BASE_DIR),
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def _wait(predicate, timeout: float, what: str, worker: Worker):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}; worker log:\n{worker.text()[-4000:]}")


def _label(project: Project, url: str) -> None:
    annotators = []
    for kind in ("careful", "careful", "noisy"):
        name = f"sim-{kind}-{len(annotators)}"
        # A barely trained policy's answers often score the same: decide, never call a tie.
        profile = replace(PRESETS[kind], tie_margin=0.0)
        annotators.append(
            (name, simulated_annotator_ensure(project=project, username=name), profile)
        )
    stats = run_pool(base_url=url, project_id=project.pk, annotators=annotators)
    assert [s.errors for s in stats] == [[]] * len(stats)


@pytest.fixture
def tiny_base_policy(tmp_path):
    from training.trainers.tiny import build_tiny_causal_lm, train_tokenizer

    tokenizer = train_tokenizer(demo.tokenizer_training_texts(), vocab_size=300)
    path = build_tiny_causal_lm(
        tokenizer, tmp_path / "policy", n_layer=1, n_embd=32, n_head=2, n_positions=64
    )
    return ModelVersion.objects.create(name="tiny-base", artifact_path=str(path))


def test_two_rounds_close_through_a_real_worker(live_server, tiny_base_policy, tmp_path):
    import redis

    redis.Redis.from_url(django_settings.CELERY_BROKER_URL).flushdb()
    project = Project.objects.create(name="loop e2e", overlap=3)
    settings = loop.LoopSettings(
        n_prompts=8,
        seed=3,
        generation={"temperature": 1.0, "max_new_tokens": 8},
        dpo={"max_steps": 4, "per_device_train_batch_size": 4, "save_steps": 2},
    ).to_dict()
    worker = Worker(tmp_path / "worker.log", tmp_path / "artifacts")
    try:
        # round 1 from the base policy, generated by the worker
        key = "e2e:round-1"
        generate_round.delay(project.pk, tiny_base_policy.pk, key, settings)
        round1 = _wait(
            lambda: (
                Round.objects.filter(project=project, source_key=key).exclude(items=None).first()
            ),
            240,
            "round 1",
            worker,
        )
        _label(project, live_server.url)
        assert Judgment.objects.filter(item__round=round1).count() == round1.items.count() * 3

        for number in (2, 3):

            def next_round(number=number):
                loop_tick.delay(project.pk, settings)
                time.sleep(3)
                found = Round.objects.filter(project=project, number=number).first()
                return found if found is not None and found.items.exists() else None

            new_round = _wait(next_round, 600, f"round {number}", worker)
            if number == 2:
                _label(project, live_server.url)
    finally:
        worker.stop()

    # each iteration left one dataset version, one succeeded DPO run and one policy version
    assert DatasetVersion.objects.filter(project=project, status="ready").count() == 2
    runs = TrainingRun.objects.filter(project=project, recipe="dpo")
    assert [r.status for r in runs] == ["succeeded", "succeeded"]
    policies = ModelVersion.objects.filter(training_run__in=runs).order_by("id")
    assert [p.parent_id for p in policies] == [tiny_base_policy.pk, policies[0].pk]
    # round 3 comes from the second policy, mixed with its parent's answers, with recorded configs
    assert new_round.model_version_id == policies[1].pk
    models = {s.candidate.model_name for i in new_round.items.all() for s in i.slots.all()}
    assert models == {policies[1].name, policies[0].name}
    cand = new_round.items.first().slots.first().candidate
    assert {"temperature", "seed", "max_new_tokens"} <= set(cand.generation_config)
    assert all("true_reward" in p.eval_results for p in policies)
    assert json.dumps(policies[1].eval_results)
    assert Round.objects.get(project=project, number=1).status == Round.Status.CLOSED
    _screenshot_dashboard(live_server.url, project)


def _screenshot_dashboard(url: str, project: Project) -> None:
    """Save the researcher dashboard over this loop's real data, for a person to look at."""
    if not os.path.exists(CHROMIUM):
        return
    from django.contrib.auth import get_user_model
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    get_user_model().objects.create_user("loop-admin", password="pw-loop-admin", is_staff=True)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/accounts/login/")
        page.fill("input[name=username]", "loop-admin")
        page.fill("input[name=password]", "pw-loop-admin")
        page.click("[type=submit]")
        for tab in ("", "models/", "training/"):
            response = page.goto(f"{url}/dashboard/projects/{project.pk}/{tab}")
            assert response is not None and response.status == 200
            page.wait_for_load_state("networkidle")
            name = tab.strip("/") or "labels"
            page.screenshot(path=str(SCREENSHOTS / f"loop-dashboard-{name}.png"), full_page=True)
        browser.close()
