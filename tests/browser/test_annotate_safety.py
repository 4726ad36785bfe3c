"""Untrusted text renders as text; a lost connection never loses an answer; leases stay alive."""

from datetime import timedelta

import pytest
from django.utils import timezone

from annotation.models import Assignment, Judgment
from tests.browser.conftest import PageRecorder, login, screenshot
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE_A = "<img src=x onerror=alert(1)> and <script>alert(2)</script>"
HOSTILE_B = (
    '[link](javascript:alert(3)) and <a href="javascript:alert(3)">click me</a>\n'
    "![pixel](http://127.0.0.1:9/tracker.png) <svg onload=alert(5)></svg>"
)
NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""


def test_hostile_text_renders_as_text_and_runs_nothing(make_page, live_server):
    project = make_project(name="Hostile", rubric="<script>alert(4)</script> Be careful.")
    annotator = make_user("ann-hostile")
    add_member(project, annotator)
    (item,) = make_items(project, 1)
    item.prompt.messages = [{"role": "user", "content": "<img src=x onerror=alert(6)> hi"}]
    item.prompt.save()
    for slot in item.slots.select_related("candidate"):
        slot.candidate.text = HOSTILE_A if slot.position == 0 else HOSTILE_B
        slot.candidate.save()

    recorder = make_page()
    page = recorder.page
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")
    page.locator("#rubric summary").click()
    page.wait_for_timeout(300)

    texts = page.locator(".candidate-body").all_inner_texts()
    assert any("<img src=x onerror=alert(1)>" in text for text in texts)
    assert any("<script>alert(2)</script>" in text for text in texts)
    assert any("[link](javascript:alert(3))" in text for text in texts)
    assert any('<a href="javascript:alert(3)">click me</a>' in text for text in texts)
    assert "<img src=x onerror=alert(6)> hi" in page.inner_text(".prompt")
    assert "<script>alert(4)</script>" in page.inner_text("#rubric")
    content = "#rubric, .prompt, .candidate"
    assert page.locator(f":is({content}) :is(img, script, svg, iframe)").count() == 0
    assert page.locator('a[href^="javascript:"], a[href^="data:"]').count() == 0
    # Clicking the would-be links does nothing either.
    page.get_by_text("click me", exact=False).first.click()
    page.wait_for_timeout(300)
    assert not any("tracker.png" in url for url in requested)
    screenshot(page, "pairwise-hostile-text")
    recorder.assert_clean()


def test_submit_survives_a_lost_connection_and_a_reload(make_page, live_server):
    project = make_project(name="Flaky network", lease_seconds=15, overlap=1)
    annotator = make_user("ann-offline")
    add_member(project, annotator)
    make_items(project, 3)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)

    sent: list[dict] = []
    failures = {"left": 3}

    def flaky(route):
        sent.append(route.request.post_data_json)
        if failures["left"] > 1:
            failures["left"] -= 1
            route.abort("internetdisconnected")
        elif failures["left"] == 1:
            failures["left"] -= 1
            route.fulfill(status=503, json={"detail": "database away", "code": "retry"})
        else:
            route.continue_()

    # The classic path (no item held ahead): the answer is retried with its item on screen.
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/?prefetch=0")
    page.wait_for_selector("#item")

    # The lease is kept alive: a heartbeat goes out (every lease/3 = 5 s here).
    first_id = page.get_attribute("#item", "data-assignment")
    leased_until = Assignment.objects.get(pk=first_id).lease_expires
    with page.expect_response(lambda r: r.url.endswith(f"/{first_id}/heartbeat/"), timeout=9000):
        pass
    assert Assignment.objects.get(pk=first_id).lease_expires > leased_until

    # Item 1: two network failures and a 503, then success; one judgment, one key.
    page.route("**/api/assignments/*/submit/", flaky)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.getElementById('save-status').textContent.includes('retrying')"
    )
    page.wait_for_function(NEXT_ITEM, arg=first_id, timeout=20_000)
    assert len(sent) == 4
    assert len({body["idempotency_key"] for body in sent}) == 1
    assert Judgment.objects.filter(assignment_id=first_id).count() == 1
    page.unroute("**/api/assignments/*/submit/")

    # Item 2: offline; the answer kept in the outbox is sent when the page is opened again.
    second_id = page.get_attribute("#item", "data-assignment")
    page.route("**/api/assignments/*/submit/", lambda route: route.abort("internetdisconnected"))
    page.keyboard.press("2")
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.getElementById('save-status').textContent.includes('retrying')"
    )
    assert second_id in page.evaluate("localStorage.getItem('prefloop.outbox.v1')")
    assert not Judgment.objects.filter(assignment_id=second_id).exists()
    # The tab is closed while offline (no "leave the page?" prompt runs) and opened again.
    context = page.context
    recorder.assert_clean()
    page.close()
    recorder = PageRecorder(context.new_page())
    page = recorder.page
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/?prefetch=0")
    page.wait_for_function(NEXT_ITEM, arg=second_id, timeout=15_000)
    judgment = Judgment.objects.get(assignment_id=second_id)
    assert judgment.shown_choice == "B"
    assert page.evaluate("localStorage.getItem('prefloop.outbox.v1')") == "{}"

    # Item 3: the lease ran out before the answer arrived: a definitive 409, no endless retry.
    third_id = page.get_attribute("#item", "data-assignment")
    Assignment.objects.filter(pk=third_id).update(
        lease_expires=timezone.now() - timedelta(seconds=1)
    )
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.getElementById('save-status').textContent.includes('Not saved')"
    )
    page.wait_for_function(NEXT_ITEM, arg=third_id)
    assert not Judgment.objects.filter(assignment_id=third_id).exists()
    recorder.assert_clean()
