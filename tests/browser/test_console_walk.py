"""A researcher's whole path through the console, in real Chromium, with a real Celery worker.

In the browser only, with the mouse: log in, create a project, add three annotators, drop a
file of prompts with candidates on the import form (preview, then import), watch labels come
in with agreement and QC verdicts (simulated annotators label through the API meanwhile),
review a disputed item, export a TRL dataset and download it, and, when the console's
training pages are installed, start a DPO run of a tiny model and watch it finish.

The test counts the steps (clicks and pages opened), prints them, and saves a screenshot of
each page at 1280x800 and at 360 px wide into PREFLOOP_SCREENSHOTS (default: a folder under
the system temp folder).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from annotation.models import (
    Adjudication,
    DatasetVersion,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
)
from annotation.simulation import PRESETS, run_pool, token_for
from evaluation.models import AnnotatorAssessment
from tests.browser.conftest import CHROMIUM, login
from tests.factories import make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.celery,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

N_ITEMS = 30
OVERLAP = 2
SHOTS = Path(os.environ.get("PREFLOOP_SCREENSHOTS", Path(tempfile.gettempdir()) / "console-walk"))
ANNOTATORS = ("walk-ann1", "walk-ann2", "walk-ann3")
# Careful readers (QC passes them) who still disagree on close calls: every item is decided
# (no tie), so two votes that differ make a dispute.
PROFILE = replace(PRESETS["careful"], noise=0.5, tie_margin=0.0)


class Walk:
    """Count what the researcher does and photograph every page they see."""

    def __init__(self, page):
        self.page = page
        self.steps: list[str] = []
        self.shots: list[Path] = []

    def step(self, what: str) -> None:
        self.steps.append(what)

    def click(self, locator, what: str, *, navigates: bool = True) -> None:
        locator.scroll_into_view_if_needed()
        box = locator.bounding_box()
        assert box is not None, f"{what}: not on the page"
        # The mouse, not the keyboard: press in the middle of the control.
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        if navigates:
            with self.page.expect_navigation():
                self.page.mouse.click(x, y)
        else:
            self.page.mouse.click(x, y)
        self.step(what)

    def shoot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        for width, height in ((1280, 800), (360, 800)):
            self.page.set_viewport_size({"width": width, "height": height})
            path = SHOTS / f"console-{len(self.shots) // 2 + 1:02d}-{name}-{width}.png"
            self.page.screenshot(path=str(path), full_page=True)
            self.shots.append(path)
        # Nothing may be wider than a 360 px screen but the tables and code, which scroll.
        self.page.set_viewport_size({"width": 360, "height": 800})
        overflow = self.page.evaluate("document.documentElement.scrollWidth")
        self.page.set_viewport_size({"width": 1280, "height": 800})
        assert overflow <= 362, f"{name}: the page is {overflow} px wide at 360 px"


def _wait(predicate, timeout: float, what: str, worker=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    log = worker.text()[-4000:] if worker is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{log}")


def _prompts_file() -> str:
    rows = []
    for i in range(N_ITEMS):
        rows.append(
            {
                "id": f"walk-{i}",
                # Short texts: QC's reading-speed check allows 50 characters a second.
                "prompt": f"Say hi ({i})",
                "candidates": [
                    {"text": f"Hi {i}.", "model_name": "policy-a"},
                    {"text": f"Hello there {i}!", "model_name": "policy-b"},
                ],
            }
        )
    return "\n".join(json.dumps(row) for row in rows) + "\n"


def _start_annotators(base_url: str, project_id: int) -> tuple[threading.Thread, list]:
    pool = []
    for username in ANNOTATORS:
        pool.append((username, token_for(base_url, username, "pw"), PROFILE))
    results: list = []

    def label():
        results.extend(
            run_pool(base_url=base_url, project_id=project_id, annotators=pool, speedup=4, seed=7)
        )

    thread = threading.Thread(target=label, daemon=True)
    thread.start()
    return thread, results


def _training_pages_exist() -> bool:
    from config.console.context import training_url

    return training_url(0) is not None


def test_a_researcher_walks_the_console_from_project_to_dataset(make_page, live_server, tmp_path):
    import redis

    from tests.celery_worker import Worker

    redis.Redis.from_url(django_settings.CELERY_BROKER_URL).flushdb()
    researcher = make_user("walk-researcher", staff=True)
    for username in ANNOTATORS:
        make_user(username)
    worker = Worker(
        queue="default,gpu",
        broker_url=django_settings.CELERY_BROKER_URL,
        log_path=tmp_path / "worker.log",
        name=f"walk-{uuid.uuid4().hex[:8]}",
    )
    recorder = make_page(width=1280, height=800, accept_downloads=True)
    page = recorder.page
    walk = Walk(page)
    base = live_server.url
    labelling = None
    try:
        # 1. Log in and open the console.
        login(recorder, live_server, researcher.username)
        walk.step("log in")
        page.goto(f"{base}/console/")
        walk.step("open /console/")
        walk.shoot("projects-empty")

        # 2. Create a project with its settings explained on the form.
        walk.click(page.get_by_role("link", name="New project"), "click New project")
        assert page.get_by_text("Annotators per item.").is_visible()
        walk.shoot("project-new")
        page.locator("#id_name").fill("Helpful replies")
        walk.step("type the project name")
        page.locator("#id_overlap").fill(str(OVERLAP))
        walk.step("set overlap to 2")
        walk.click(page.get_by_role("button", name="Create project"), "click Create project")
        page.wait_for_url("**/console/projects/*/")
        project = Project.objects.get(name="Helpful replies")
        assert project.overlap == OVERLAP

        # 3. Add three annotators by username.
        for username in ANNOTATORS:
            page.locator("#id_username").fill(username)
            walk.step(f"type {username}")
            walk.click(page.get_by_role("button", name="Add member"), f"add {username}")
            page.wait_for_selector(f'[data-member="{username}"]')
        assert Membership.objects.filter(project=project, role="annotator").count() == 3
        walk.shoot("project-members")

        # 4. Data: drop a file of prompts with candidates, check the preview, import it.
        walk.click(page.get_by_role("link", name="Data", exact=True), "click Data")
        drop = page.evaluate_handle(
            """(text) => {
              const dt = new DataTransfer();
              dt.items.add(new File([text], "prompts.jsonl", {type: "application/x-ndjson"}));
              return dt;
            }""",
            _prompts_file(),
        )
        page.dispatch_event("[data-dropzone]", "drop", {"dataTransfer": drop})
        walk.step("drop prompts.jsonl on the import form")
        page.wait_for_selector("#import-preview:not([hidden])")
        assert page.locator("#import-preview tbody tr").count() == 5
        assert "Say hi (0)" in page.locator("#import-preview tbody").inner_text()
        walk.shoot("data-preview")
        walk.click(
            page.get_by_role("button", name="Import", exact=True), "click Import", navigates=False
        )
        page.wait_for_selector('[data-report="items_created"]')
        assert page.locator('[data-report="items_created"]').inner_text() == str(N_ITEMS)
        walk.shoot("data-imported")

        # 5. Labels come in (simulated annotators, through the API); the page refreshes.
        labelling, stats = _start_annotators(base, project.pk)
        walk.click(page.get_by_role("link", name="Projects", exact=True), "click Projects")
        walk.click(page.get_by_role("link", name="Helpful replies"), "open the project")
        labelling.join(timeout=300)
        assert not labelling.is_alive(), "the simulated annotators did not finish"
        assert [s.errors for s in stats] == [[]] * len(ANNOTATORS), stats
        done = Judgment.objects.filter(project=project).count()
        assert done == N_ITEMS * OVERLAP
        page.wait_for_function(
            """(done) => {
              const el = document.querySelector('[data-stat="judgments"]');
              return el && el.textContent.trim().startsWith(`${done} /`);
            }""",
            arg=done,
            timeout=30_000,
        )
        # QC checks run on the worker after every 20 judgments of an annotator.
        _wait(
            lambda: AnnotatorAssessment.objects.filter(project=project).exists(),
            120,
            "a QC verdict",
            worker,
        )
        page.wait_for_function(
            """() => [...document.querySelectorAll('[data-member] td:nth-child(5)')]
                 .some((td) => /pass|pause/.test(td.textContent))""",
            timeout=30_000,
        )
        # Agreement is recomputed at most every 10 s; the panel polls every 3 s.
        page.wait_for_function(
            """() => {
              const el = document.querySelector('[data-stat="alpha"]');
              return el && /^-?[0-9]/.test(el.textContent.trim());
            }""",
            timeout=30_000,
        )
        walk.step("watch the labels, agreement and QC come in (no reload)")
        walk.shoot("project-labelled")

        # 6. Review: look for disputes, read the labels with trust, give a verdict.
        walk.click(page.get_by_role("link", name="Review", exact=True), "click Review")
        walk.click(page.get_by_role("button", name="Look for new disputes"), "look for disputes")
        page.wait_for_selector("article.review-item")
        walk.shoot("review")
        first = page.locator("article.review-item").first
        item_id = int(first.get_attribute("data-item"))
        labels = first.locator("table.labels tbody tr")
        assert labels.count() == OVERLAP
        assert "policy-" not in first.inner_text()  # no model names, even to reviewers
        walk.click(first.get_by_label("B is better"), "choose B is better", navigates=False)
        walk.click(first.get_by_role("button", name="Save verdict"), "click Save verdict")
        verdict = _wait(
            lambda: Adjudication.objects.filter(item_id=item_id).first(), 15, "the verdict"
        )
        page.wait_for_load_state()
        assert verdict.choice == "B" and verdict.reviewer == researcher

        # 7. Export a TRL dataset where the verdict wins, then download train.jsonl.
        walk.click(page.get_by_role("link", name="Data", exact=True), "click Data")
        page.locator("#id_name").fill("walk trl")
        walk.step("name the export")
        page.locator("#id_aggregation").select_option("majority")
        walk.step("choose majority aggregation")
        assert page.locator("#id_adjudicated_wins").is_checked()
        page.locator("#id_train").fill("1")
        page.locator("#id_validation").fill("0")
        page.locator("#id_test").fill("0")
        walk.step("put every row in train")
        walk.click(page.get_by_role("button", name="Export", exact=True), "click Export")
        page.wait_for_selector('#dataset[data-status="ready"]', timeout=120_000)
        walk.shoot("dataset")
        dv = DatasetVersion.objects.get(project=project, name="walk trl")
        assert dv.policies["adjudicated_wins"] is True
        with page.expect_download() as info:
            walk.click(
                page.locator('a[data-file="train.jsonl"]'), "download train.jsonl", navigates=False
            )
        rows = [json.loads(line) for line in Path(info.value.path()).read_text().splitlines()]
        assert len(rows) == dv.split_counts["train"] > 0
        assert all(set(row) >= {"prompt", "chosen", "rejected"} for row in rows)
        a, b = (
            ItemCandidate.objects.filter(item_id=item_id)
            .order_by("position")
            .values_list("candidate__text", flat=True)
        )
        settled = [row for row in rows if row["chosen"] in (a, b)]
        assert [(r["chosen"], r["rejected"]) for r in settled] == [(b, a)]

        # 8. Training (the console's training pages, when installed): a tiny DPO run.
        if _training_pages_exist():
            _train(walk, page, project, dv, worker, tmp_path)

        recorder.assert_clean()
        assert [e for e in recorder.console_errors if "favicon" not in e] == []
    finally:
        if labelling is not None:
            labelling.join(timeout=5)
        worker.stop()
    print(f"\nThe researcher's walk took {len(walk.steps)} steps:")
    for number, what in enumerate(walk.steps, start=1):
        print(f"  {number:2d}. {what}")
    print(f"Screenshots ({len(walk.shots)}): {SHOTS}")


def _train(walk, page, project, dv, worker, tmp_path):
    """Start a few steps of DPO on a tiny model from the console and watch the run finish."""
    from tests.factories import make_tiny_demo_policy
    from training.models import TrainingRun

    # The lab registered a tiny policy for this project's data (a server-side step).
    policy = make_tiny_demo_policy(tmp_path / "policy", name="walk-tiny", n_positions=64)
    policy.dataset_version = dv
    policy.save(update_fields=["dataset_version"])

    walk.click(page.get_by_role("link", name="Training", exact=True), "click Training")
    walk.shoot("training")
    walk.click(page.locator('a[data-recipe="dpo"]'), "choose DPO")
    page.locator("#id_dataset_version_id").select_option(str(dv.pk))
    page.locator("#id_base_model_id").select_option(f"version:{policy.pk}")
    walk.step("choose the dataset version and the base model")
    for name, value in (
        ("max_steps", "3"),
        ("per_device_train_batch_size", "4"),
        ("save_steps", "3"),
    ):
        page.locator(f"#id_{name}").fill(value)
    walk.step("set 3 steps of batch 4")
    walk.shoot("training-new")
    walk.click(page.get_by_role("button", name="Start the run"), "click Start the run")
    run = _wait(lambda: TrainingRun.objects.filter(project=project).first(), 15, "the run")
    page.wait_for_function(
        """() => {
          const el = document.querySelector("[data-run-status]");
          return el && ["succeeded", "failed", "cancelled"].includes(el.textContent.trim());
        }""",
        timeout=600_000,
    )
    run.refresh_from_db()
    assert run.status == "succeeded", (run.status, run.error, worker.text()[-3000:])
    assert page.locator("[data-run-status]").inner_text() == "succeeded"
    walk.step("watch the run finish (no reload)")
    walk.shoot("training-run")
