"""Enter -> next item visible on the annotator page, with prefetch on and off in the same run.

A script, not a test. It makes its own database (`--db`), a pairwise project with enough
items, one annotator (quality control off: the script answers fast and always on the left),
starts the app under `manage.py runserver` (local settings, threaded)
and drives the annotator page in headless Chromium with the keyboard, alternating the two
modes item block by item block so a change in machine load hits both alike:

- prefetch off (`?prefetch=0`): press 1, Enter (the answer is held 5 s), Enter again (send
  now); the time is from that second Enter to the next item painted: one round trip, the
  submit whose reply carries the next item, rendered by the server.
- prefetch on (`?prefetch=1`): press 1, Enter; the time is from Enter to the next item
  painted. The page held the next item under its own lease; before the next press the
  script waits for the held answer to be sent after its 5-second hold and for the item after
  it to be held (as an annotator who reads for more than 5 s would see it).

"Painted" is the first animation frame after the item element changed, measured in the page
(`performance.now()`), so the figures leave out Playwright's own latency. Printed: median,
p95 and max per mode, and the load average before and after.

    .venv/bin/python benchmarks/annotate_frame.py --items 50

Measured 2026-12-02 on the shared 2-core machine while other developers' test suites and a
long training benchmark ran (`--items 50`):

    Enter -> next item painted, 50 items per mode (ms):
      mode           median     p95     max
      prefetch off     75.6   149.6   286.5
      prefetch on       7.3    14.9    49.0
    load average (1, 5, 15 min): before 4.05 4.68 6.10, after 5.09 4.46 5.60; 2 CPUs

With prefetch the next item is painted in the frame of Enter (a 60 Hz frame is 16.7 ms);
without it, the figure is the one round trip (submit with the next item) plus rendering.
"""

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
CHROMIUM = "/usr/bin/chromium"
BLOCK = 10  # items per mode before switching to the other

WATCH = """() => {
  const last = document.getElementById("item").dataset.assignment;
  window.__frame = { enter: 0, last, shown: [] };
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter") window.__frame.enter = performance.now();
  }, true);
  new MutationObserver(() => {
    const el = document.getElementById("item");
    const id = el && el.dataset.assignment;
    if (!id || id === window.__frame.last) return;
    window.__frame.last = id;
    const started = window.__frame.enter;
    requestAnimationFrame(() => window.__frame.shown.push(performance.now() - started));
  }).observe(document.getElementById("task"), { childList: true });
}"""


def _psql(sql: str) -> None:
    subprocess.run(["psql", "-h", HOST, "-U", "postgres", "-d", "postgres", "-qc", sql], check=True)


def _env(db: str) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DATABASE_URL": f"postgres://postgres@{HOST}:5432/{db}",
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": HOST,
        "DJANGO_SECRET_KEY": "annotate-frame-benchmark-throwaway",
        "DJANGO_LOG_LEVEL": "WARNING",
    }


def _prepare(n_items: int) -> int:
    """Create a project with n_items pairwise items and the annotator `frame` (password pw)."""
    import django

    sys.path.insert(0, str(ROOT))
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from annotation.imports import items_import
    from annotation.models import Membership, Project
    from evaluation.models import QualityPolicy

    call_command("migrate", verbosity=0)
    project = Project.objects.create(name="frame", overlap=1, lease_seconds=600)
    rng = random.Random(0)
    words = ("lorem", "ipsum", "dolor", "sit", "amet", "**bold**", "`code`")
    lines = []
    for i in range(n_items):
        text = lambda: " ".join(rng.choice(words) for _ in range(120))  # noqa: E731
        lines.append(
            json.dumps(
                {
                    "id": f"q{i}",
                    "prompt": f"Question {i}: explain topic {rng.randrange(10**9)}.",
                    "candidates": [
                        {"text": text(), "model_name": "policy-v1"},
                        {"text": text(), "model_name": "policy-v0"},
                    ],
                }
            )
        )
    items_import(project=project, stream=io.StringIO("\n".join(lines)))
    user = get_user_model().objects.create_user("frame", password="pw")
    Membership.objects.create(project=project, user=user, role=Membership.Role.ANNOTATOR)
    # The script answers fast and always on the left: quality control would pause it.
    QualityPolicy.objects.update_or_create(project=project, defaults={"enabled": False})
    return project.pk


def _wait_for(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _block(page, *, prefetch: bool, n: int) -> None:
    """Judge n items in one mode; the times land in window.__frame.shown."""
    for _ in range(n):
        if page.query_selector("#item") is None:
            return
        count = page.evaluate("window.__frame.shown.length")
        if prefetch:
            # The held answer has been sent and the item after the next one is held.
            page.wait_for_function(
                "() => !document.getElementById('save-status').textContent.includes('Submitting')"
                " && Boolean(document.getElementById('task').dataset.ahead)",
                timeout=20_000,
            )
        page.keyboard.press("1")
        page.keyboard.press("Enter")
        if not prefetch:
            page.wait_for_selector("#undo-btn:not([hidden])")
            page.keyboard.press("Enter")
        try:
            page.wait_for_function(f"() => window.__frame.shown.length > {count}", timeout=20_000)
        except Exception:
            state = page.evaluate(
                "() => [document.getElementById('item')?.dataset.assignment,"
                " document.getElementById('task').dataset.ahead,"
                " document.getElementById('save-status').textContent, location.search,"
                " window.__frame, document.getElementById('task').innerText.slice(0, 300)]"
            )
            raise RuntimeError(f"no next item (prefetch {prefetch}): {state}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=50, help="items judged per mode")
    parser.add_argument("--db", default="prefloop_annotate_frame", help="a database to recreate")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    _psql(f"DROP DATABASE IF EXISTS {args.db} WITH (FORCE)")
    _psql(f"CREATE DATABASE {args.db}")
    env = _env(args.db)
    os.environ.update(env)
    project_id = _prepare(2 * args.items + 10)
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"{HOST}:{args.port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://{HOST}:{args.port}"
    load_before = os.getloadavg()
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        _wait_for(f"{base}/accounts/login/")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}/accounts/login/")
            page.get_by_label("Username").fill("frame")
            page.get_by_label("Password").fill("pw")
            page.keyboard.press("Enter")
            page.wait_for_url(f"{base}/")
            prefetch = False
            while min(len(times[False]), len(times[True])) < args.items:
                mode = "1" if prefetch else "0"
                page.goto(f"{base}/projects/{project_id}/annotate/?prefetch={mode}")
                page.wait_for_selector("#item")
                page.evaluate(WATCH)
                todo = min(BLOCK, args.items - len(times[prefetch]))
                _block(page, prefetch=prefetch, n=todo)
                times[prefetch] += page.evaluate("window.__frame.shown")
                if prefetch:  # let the last held answer go before leaving the page
                    page.wait_for_function(
                        "() => !document.getElementById('save-status').textContent"
                        ".includes('Submitting')",
                        timeout=20_000,
                    )
                prefetch = not prefetch
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    load_after = os.getloadavg()
    print(f"Enter -> next item painted, {args.items} items per mode (ms):")
    print(f"  {'mode':<13}{'median':>8}{'p95':>8}{'max':>8}")
    for prefetch in (False, True):
        values = times[prefetch][: args.items]
        name = "prefetch on" if prefetch else "prefetch off"
        print(
            f"  {name:<13}{statistics.median(values):8.1f}{_pct(values, 0.95):8.1f}"
            f"{max(values):8.1f}"
        )
    print(
        f"load average (1, 5, 15 min): before {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after {' '.join(f'{x:.2f}' for x in load_after)}; {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
