"""In Chromium: the dashboard's training page follows a running run without a reload (the
runs table and the curves refresh, the new curves are drawn) and breaks no CSP rule."""

from __future__ import annotations

import json

import pytest

from annotation.models import Membership
from tests.browser.conftest import login, screenshot
from tests.factories import add_member, make_project, make_user
from training.models import TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)


def _append(folder, records):
    with (folder / "metrics.jsonl").open("a") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("width", [1280, 360])
def test_a_running_run_is_followed_without_a_reload(make_page, live_server, tmp_path, width):
    project = make_project()
    researcher = make_user("live-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    run = TrainingRun.objects.create(
        recipe="dpo", project=project, status="running", progress=0.25, output_dir=str(tmp_path)
    )
    _append(tmp_path, [{"step": 1, "loss": 0.69, "rewards/margins": 0.0}])

    recorder = make_page(width=width, height=900)
    page = recorder.page
    login(recorder, live_server, "live-researcher")
    page.goto(f"{live_server.url}/dashboard/projects/{project.pk}/training/")
    page.wait_for_selector("#panel-curves [data-chart][data-drawn]")
    page.evaluate("window.__notReloaded = true")
    assert "0.250" in page.locator("#panel-runs").inner_text()

    # the run moves on and logs two more steps, with its DPO margins
    TrainingRun.objects.filter(pk=run.pk).update(progress=0.75)
    _append(
        tmp_path,
        [
            {"step": 2, "loss": 0.6, "rewards/margins": 0.2, "rewards/accuracies": 0.6},
            {"step": 3, "loss": 0.5, "rewards/margins": 0.4, "rewards/accuracies": 0.7},
        ],
    )
    page.wait_for_function(
        "() => document.querySelector('#panel-runs').innerText.includes('0.750')",
        timeout=20_000,
    )
    page.wait_for_function(
        """() => [...document.querySelectorAll('#panel-curves .curve-cell h3')]
              .some((h) => h.textContent.includes('rewards/accuracies'))""",
        timeout=20_000,
    )
    # the same document all along, the new chart drawn on a canvas
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#panel-curves [data-chart][data-drawn] canvas").count() >= 3
    screenshot(page, f"dashboard-training-live-{width}")
    # a table wider than the panel scrolls inside it, so the page does not
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    recorder.assert_clean()
    assert recorder.console_errors == []
