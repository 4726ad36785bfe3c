"""Leaving during the hold, the QC pause notice, the guidelines key, API docs and admin pages."""

import time

import pytest

from annotation.models import Assignment, Judgment, Membership
from evaluation.services import annotator_pause
from tests.browser.conftest import held_ahead, login, screenshot, wait_for_judgment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""
FAST_REASON = "80% of 20 judgments too fast (limit 50%)"


ENTER_THEN_LEAVE = """() => {
  document.getElementById("item").dispatchEvent(
    new KeyboardEvent("keydown", { key: "Enter", bubbles: true, cancelable: true })
  );
  const shown = document.getElementById("item").dataset.assignment;
  const undoOffered = !document.getElementById("undo-btn").hidden;
  document.querySelector("a.back-link").click(); // "← Projects"
  return [shown, undoOffered];
}"""


def _wait_for(predicate, seconds=8.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_leaving_during_the_hold_stores_the_answer_once(make_page, live_server):
    project = make_project(name="Leave early", overlap=1)
    annotator = make_user("ann-leave")
    add_member(project, annotator)
    make_items(project, 3)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")

    # Item 1 with item 2 held ahead: Enter shows item 2 at once, item 1's answer follows.
    first_id = page.get_attribute("#item", "data-assignment")
    second_id = held_ahead(page, annotator)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    assert page.get_attribute("#item", "data-assignment") == second_id
    wait_for_judgment(first_id)
    page.wait_for_selector("#undo-btn", state="hidden")

    # A later item: choose, submit, and leave by "← Projects" during the hold.
    third_id = held_ahead(page, annotator)
    assert third_id
    page.keyboard.press("2")
    # Enter and the click in one task, so the click surely falls inside the 5-second hold
    shown, undo_offered = page.evaluate(ENTER_THEN_LEAVE)
    assert (shown, undo_offered) == (third_id, True)
    page.wait_for_url(f"{live_server.url}/")

    # The answer reached the server without the task page being opened again.
    assert _wait_for(lambda: Judgment.objects.filter(assignment_id=second_id).exists())
    assert Judgment.objects.get(assignment_id=second_id).shown_choice == "B"
    assert page.evaluate("localStorage.getItem('prefloop.outbox.v1') || '{}'") == "{}"

    # Coming back serves a new item and the answer is not sent a second time.
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")
    assert page.get_attribute("#item", "data-assignment") not in (first_id, second_id)
    page.wait_for_timeout(1500)
    assert Judgment.objects.filter(assignment_id=second_id).count() == 1
    assert recorder.dialogs == []
    recorder.assert_clean()


def test_typing_another_address_during_the_hold_still_sends_the_answer(make_page, live_server):
    project = make_project(name="Navigate away", overlap=1)
    annotator = make_user("ann-away")
    add_member(project, annotator)
    make_items(project, 2)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")
    assignment_id = page.get_attribute("#item", "data-assignment")
    ahead = held_ahead(page, annotator)
    page.keyboard.press("2")
    page.keyboard.press("Enter")
    assert page.get_attribute("#item", "data-assignment") == ahead  # the answer waits off screen
    page.wait_for_selector("#undo-btn:not([hidden])")
    # Not a link of the page: the browser itself navigates (address bar, bookmark).
    page.goto(f"{live_server.url}/")

    assert _wait_for(lambda: Judgment.objects.filter(assignment_id=assignment_id).exists())
    # The project list sends what the outbox still holds; the server replays, nothing doubles.
    page.wait_for_function("() => (localStorage.getItem('prefloop.outbox.v1') || '{}') === '{}'")
    page.wait_for_timeout(500)
    assert Judgment.objects.filter(assignment_id=assignment_id).count() == 1
    assert Judgment.objects.get(assignment_id=assignment_id).shown_choice == "B"
    recorder.assert_clean()


def test_paused_annotator_sees_the_reason_and_whom_to_contact(make_page, live_server, settings):
    project = make_project(name="Paused project", overlap=1)
    annotator = make_user("ann-paused")
    researcher = make_user("dr-rivera")
    researcher.first_name, researcher.last_name = "Ana", "Rivera"
    researcher.email = "ana.rivera@example.org"
    researcher.save()
    add_member(project, annotator)
    add_member(project, researcher, role=Membership.Role.RESEARCHER)
    make_items(project, 3)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")
    assignment_id = page.get_attribute("#item", "data-assignment")
    ahead = held_ahead(page, annotator)
    assert ahead

    # QC pauses the annotator while an item is open and the next is held ahead; both leases
    # end, and the answer cannot be stored.
    annotator_pause(
        project=project,
        annotator_id=annotator.pk,
        failed_checks=["speed"],
        reasons=[FAST_REASON],
    )
    assert Assignment.objects.get(pk=ahead).status == Assignment.Status.EXPIRED
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    # The held item is shown at once; once the held answer is refused, the page asks the
    # server what to show instead of leaving an item that cannot be answered.
    assert page.get_attribute("#item", "data-assignment") == ahead
    page.wait_for_selector("#item-notice", timeout=15_000)
    notice = page.locator("#item-notice")
    assert FAST_REASON in notice.inner_text()
    assert "Ana Rivera" in notice.inner_text()
    assert notice.locator('a[href="mailto:ana.rivera@example.org"]').count() == 1
    assert notice.get_by_role("link", name="Back to projects").is_visible()
    screenshot(page, "paused-notice")
    assert not Judgment.objects.filter(assignment_id=assignment_id).exists()

    # The project list says why too; a configured contact is named on the task page.
    page.goto(f"{live_server.url}/")
    assert FAST_REASON in page.inner_text(".project-list")
    settings.PREFLOOP_ANNOTATOR_CONTACT = "qc-help@example.org"
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    notice = page.locator("#item-notice")
    assert FAST_REASON in notice.inner_text()
    assert notice.locator('a[href="mailto:qc-help@example.org"]').count() == 1
    recorder.assert_clean()


def test_pause_reason_names_no_gold_or_repeat_figures(make_page, live_server):
    project = make_project(name="Paused by checks", overlap=1, gold_rate=0.2)
    annotator = make_user("ann-paused-gold")
    add_member(project, annotator)
    make_items(project, 2)
    annotator_pause(
        project=project,
        annotator_id=annotator.pk,
        failed_checks=["gold", "stability", "speed"],
        reasons=[
            "gold accuracy 0.40 < 0.70 on 10 items (95% upper bound 0.62)",
            "self-agreement 0.50 < 0.80 on 6 repeats",
            FAST_REASON,
        ],
    )
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    shown = [page.inner_text("#item-notice")]
    page.goto(f"{live_server.url}/")
    shown.append(page.inner_text(".project-list"))
    for text in shown:
        # Their own pace is shown as measured; gold and repeat checks only in plain words.
        assert FAST_REASON in text
        assert "check items" in text and "shown twice" in text
        for secret in ("gold", "0.40", "10 items", "repeats", "0.62"):
            assert secret not in text.lower()
    recorder.assert_clean()


def test_guidelines_toggle_with_g(make_page, live_server):
    project = make_project(name="Guidelines", rubric="Prefer **facts**.", ask_rationale=True)
    annotator = make_user("ann-guide")
    add_member(project, annotator)
    make_items(project, 2)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")
    is_open = "document.getElementById('rubric').open"
    assert page.evaluate(is_open) is False
    page.keyboard.press("g")
    assert page.evaluate(is_open) is True
    assert page.locator(".rubric-body").is_visible()
    page.keyboard.press("g")
    assert page.evaluate(is_open) is False
    # A "g" typed in the rationale is text, not a shortcut.
    page.keyboard.press("r")
    page.keyboard.type("good")
    assert page.evaluate(is_open) is False
    assert page.input_value("#rationale") == "good"
    page.keyboard.press("Escape")
    # It still works on the next item.
    assignment_id = page.get_attribute("#item", "data-assignment")
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function(NEXT_ITEM, arg=assignment_id)
    page.keyboard.press("g")
    assert page.evaluate(is_open) is True
    page.keyboard.press("g")
    assert page.evaluate(is_open) is False
    recorder.assert_clean()


def test_api_docs_page_has_no_csp_violation(make_page, live_server):
    staff = make_user("docs-reader", staff=True)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, staff.username)
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    page.wait_for_timeout(500)
    assert recorder.csp_violations() == []
    recorder.assert_clean()


def test_admin_pages_link_a_favicon_that_loads(make_page, live_server):
    staff = make_user("admin-user", staff=True)
    staff.is_superuser = True
    staff.save()
    recorder = make_page()
    page = recorder.page
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    for path in ("/admin/login/", "/admin/"):
        if path == "/admin/":
            page.get_by_label("Username").fill(staff.username)
            page.get_by_label("Password").fill("pw")
            page.keyboard.press("Enter")
            page.wait_for_url(f"{live_server.url}/admin/")
        else:
            page.goto(f"{live_server.url}{path}")
        href = page.get_attribute('link[rel~="icon"]', "href")
        assert href
        response = page.request.get(f"{live_server.url}{href}")
        assert response.status == 200
        assert response.headers["content-type"].startswith("image/")
    assert missing == []
    recorder.assert_clean()
