"""Real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright against live_server.

Every page opened through the `annotator_page` fixture records dialogs, Content-Security-Policy
violations and the body of every response, so tests can assert that nothing ran, nothing was
blocked and nothing secret was sent.
"""

import contextlib
import os
import time
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM would refuse to run.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"

# Records CSP violations from inside the page (the console message is a second witness).
CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(
    `${e.violatedDirective} ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`
  );
});
"""


@pytest.fixture(scope="module")
def browser():
    """Start Chromium per test module, so no Playwright event loop outlives the browser tests."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


class PageRecorder:
    """What one page saw: dialogs, CSP violations, console errors and response bodies."""

    def __init__(self, page):
        self.page = page
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.bodies: list[tuple[str, bytes]] = []
        page.on("dialog", self._on_dialog)
        page.on("console", self._on_console)
        page.on("response", self._on_response)
        page.add_init_script(CSP_LISTENER)

    def _on_dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _on_console(self, message):
        if message.type in ("error", "warning"):
            self.console_errors.append(message.text)

    def _on_response(self, response):
        try:
            self.bodies.append((response.url, response.body()))
        except Exception:  # redirects and aborted requests have no body
            self.bodies.append((response.url, b""))

    def csp_violations(self) -> list[str]:
        from_console = [
            text
            for text in self.console_errors
            if "Content Security Policy" in text or "Refused to" in text
        ]
        try:
            from_page = self.page.evaluate("window.__cspViolations || []")
        except Exception:
            from_page = []
        return from_console + from_page

    def assert_clean(self):
        assert self.dialogs == [], f"dialogs opened: {self.dialogs}"
        assert self.csp_violations() == [], f"CSP violations: {self.csp_violations()}"

    def assert_no_secret(self, secrets):
        assert self.bodies, "no response was recorded"
        for url, body in self.bodies:
            text = body.decode("utf-8", "replace").lower()
            for secret in secrets:
                assert secret.lower() not in text, f"{secret!r} in the response from {url}"


@pytest.fixture
def make_page(browser, live_server, transactional_db):
    """Open a fresh browser context (own cookies and storage) at a viewport size."""
    contexts = []

    def _make(width=1280, height=900, **options):
        context = browser.new_context(viewport={"width": width, "height": height}, **options)
        context.set_default_timeout(15_000)
        contexts.append(context)
        return PageRecorder(context.new_page())

    yield _make
    # Stop the pages' timers and requests first, and give the server a moment to finish what
    # it is serving: a request still in flight would hold locks against the database flush.
    for context in contexts:
        for page in context.pages:
            with contextlib.suppress(Exception):  # a page that is already closing
                page.goto("about:blank")
    time.sleep(0.3)
    for context in contexts:
        context.close()


def login(recorder, live_server, username, password="pw"):
    page = recorder.page
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/")


def screenshot(page, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


# The annotator page holds the next item ahead (its id in #task[data-ahead]) or knows that
# nothing is left to hold (#task[data-ahead-done]).
AHEAD_SETTLED = """() => {
  const task = document.getElementById("task");
  return Boolean(task.dataset.ahead) || task.dataset.aheadDone === "1";
}"""


def held_ahead(page, user) -> str | None:
    """Wait until the page holds the next item ahead; return its id, or None if none is left.

    The item held ahead is leased to `user` under its own lease, marked `ahead`.
    """
    from annotation.models import Assignment

    page.wait_for_function(AHEAD_SETTLED)
    ahead = page.get_attribute("#task", "data-ahead")
    if not ahead:
        return None
    held = Assignment.objects.get(pk=ahead)
    assert held.ahead and held.annotator_id == user.pk
    assert held.status == Assignment.Status.LEASED
    return ahead


def wait_for_judgment(assignment_id, timeout=15.0):
    """Wait until the answer to an assignment is stored; return it."""
    from annotation.models import Judgment

    deadline = time.monotonic() + timeout
    while (judgment := Judgment.objects.filter(assignment_id=assignment_id).first()) is None:
        assert time.monotonic() < deadline, f"no judgment for assignment {assignment_id}"
        time.sleep(0.05)
    return judgment
