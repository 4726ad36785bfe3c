"""The evaluation dashboard in real headless Chromium: every chart drawn, no CSP violation.

Builds the realistic world of tests/console/test_dashboard.py (three policies over three
rounds labelled by five annotators, a reward model with stored evaluate_rm metrics, a PPO
run whose KL explodes), logs in as the project's researcher and saves a full-page screenshot
of each section to test-artifacts/screenshots/dashboard-*.png.
"""

import os
from pathlib import Path

import pytest

from tests.browser.conftest import CHROMIUM, login, screenshot
from tests.console.test_dashboard import build_evaluation_world

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

ALL_DRAWN = """() => {
  const charts = document.querySelectorAll("[data-chart]");
  return charts.length > 0 && [...charts].every((el) => el.dataset.drawn === "true");
}"""


def _open(recorder, url):
    page = recorder.page
    page.goto(url)
    page.wait_for_function(ALL_DRAWN)
    return page


def test_dashboard_sections_draw_every_chart(make_page, live_server, tmp_path):
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    w = build_evaluation_world(tmp_path)
    recorder = make_page(width=1400, height=1000)
    login(recorder, live_server, w.researcher.username)
    base = f"{live_server.url}/dashboard"
    pid = w.project.pk
    sections = {
        "dashboard-home": (f"{base}/", 1),
        "dashboard-labels": (f"{base}/projects/{pid}/", 5),
        "dashboard-models": (f"{base}/projects/{pid}/models/", 3),
        "dashboard-reward-models": (f"{base}/projects/{pid}/reward-models/", 3),
        "dashboard-training": (f"{base}/projects/{pid}/training/", 1),
    }
    for name, (url, min_charts) in sections.items():
        if name == "dashboard-home":
            page = recorder.page
            page.goto(url)
            assert page.get_by_role("link", name=w.project.name).first.is_visible()
        else:
            page = _open(recorder, url)
            drawn = page.locator("[data-chart] canvas").count()
            assert drawn >= min_charts, (name, drawn)
        screenshot(page, name)

    # Training: one small chart per curve, alarms listed beside them.
    page = _open(recorder, f"{base}/projects/{pid}/training/")
    assert page.locator(".curve-cell canvas").count() == 6
    assert page.locator("#panel-alarms td", has_text="kl_").count() >= 1

    # A chart's CSV link downloads its numbers.
    page = _open(recorder, f"{base}/projects/{pid}/models/")
    with page.expect_download() as info:
        page.locator("#panel-leaderboard .csv-link").click()
    download = info.value
    text = Path(download.path()).read_text(encoding="utf-8")
    assert text.splitlines()[0].startswith("rank,model,rating,ci low,ci high")
    assert "ppo-r2" in text

    # Tooltips and charts work without any inline script or style.
    recorder.assert_clean()
    assert [e for e in recorder.console_errors if "favicon" not in e] == []
