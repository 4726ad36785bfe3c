"""Prefetch on the annotator page: the next item is held ahead and shown in the frame of Enter.

The page is opened with `?prefetch=1`; `?prefetch=0` is the one-round-trip page without it.
"""

import time

import pytest

from annotation.models import Assignment, Judgment
from tests.browser.conftest import login
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Press Enter on the item and read which item is on screen in the same task: a swap that
# waited for any network answer could not have happened yet.
ENTER_AND_READ = """() => {
  const before = document.getElementById("item").dataset.assignment;
  document.getElementById("item").dispatchEvent(
    new KeyboardEvent("keydown", { key: "Enter", bubbles: true, cancelable: true })
  );
  return [before, document.getElementById("item").dataset.assignment];
}"""


HOLDS_AHEAD = "() => Boolean(document.getElementById('task').dataset.ahead)"


def _held_ahead(user, page=None, timeout=10.0) -> Assignment:
    """Wait until an item is held ahead for `user` (and the page holds it)."""
    if page is not None:
        page.wait_for_function(HOLDS_AHEAD)
        held = Assignment.objects.get(pk=page.get_attribute("#task", "data-ahead"))
        assert held.ahead and held.annotator_id == user.pk
        return held
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = Assignment.objects.filter(
            annotator=user, ahead=True, status=Assignment.Status.LEASED
        ).first()
        if held is not None:
            return held
        time.sleep(0.05)
    raise AssertionError("no item was held ahead")


def _open(make_page, live_server, project, user, *, prefetch="1", **options):
    recorder = make_page(**options)
    login(recorder, live_server, user.username)
    recorder.page.goto(f"{live_server.url}/projects/{project.pk}/annotate/?prefetch={prefetch}")
    recorder.page.wait_for_selector("#item")
    return recorder


def _requests(page) -> list[str]:
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    return seen


def test_enter_shows_the_held_item_in_the_same_frame_and_undo_returns(make_page, live_server):
    project = make_project(name="Prefetch", overlap=1)
    user = make_user("ann-prefetch")
    add_member(project, user)
    make_items(project, 4)
    recorder = _open(make_page, live_server, project, user)
    page = recorder.page
    first = page.get_attribute("#item", "data-assignment")
    held = _held_ahead(user, page)
    assert str(held.pk) != first
    seen = _requests(page)

    # When the annotator picks A and presses Enter
    page.keyboard.press("1")
    before, after = page.evaluate(ENTER_AND_READ)

    # Then the held item is on screen in the same task, and nothing went to the server
    assert (before, after) == (first, str(held.pk))
    assert seen == []
    page.wait_for_selector("#undo-btn:not([hidden])")
    assert "previous answer" in page.inner_text("#save-status")
    assert not Judgment.objects.filter(assignment_id=first).exists()

    # When they undo: the first item is back with its answer, the second is still held
    page.keyboard.press("u")
    page.wait_for_selector("#undo-btn", state="hidden")
    assert page.get_attribute("#item", "data-assignment") == first
    assert page.is_checked('input[name="choice"][value="A"]')
    again = Assignment.objects.get(pk=held.pk)
    assert again.ahead and again.status == Assignment.Status.LEASED
    assert not any("/submit/" in url for url in seen)

    # When they choose B, press Enter and let the hold run out
    page.keyboard.press("2")
    _, shown = page.evaluate(ENTER_AND_READ)
    assert shown == str(held.pk)
    deadline = time.monotonic() + 15
    while not Judgment.objects.filter(assignment_id=first).exists():
        assert time.monotonic() < deadline, "the held answer was never sent"
        time.sleep(0.1)

    # Then one judgment (B) is stored, no request asked for the next item separately, the
    # item on screen is now the current one and the item after it is held ahead
    assert Judgment.objects.get(assignment_id=first).shown_choice == "B"
    assert not any(
        "/annotate/next/" in url or ("/api/projects/" in url and "/next/" in url) for url in seen
    )
    page.wait_for_function(
        "() => document.getElementById('save-status').textContent.includes('Saved')"
    )
    assert not Assignment.objects.get(pk=held.pk).ahead
    third = _held_ahead(user)
    assert third.pk not in (held.pk, int(first))
    recorder.assert_clean()


def test_leaving_the_page_releases_the_held_item_to_another_annotator(make_page, live_server):
    project = make_project(name="Prefetch leave", overlap=1)
    user, other = make_user("ann-leave"), make_user("ann-other")
    add_member(project, user)
    add_member(project, other)
    make_items(project, 2)
    recorder = _open(make_page, live_server, project, user)
    held = _held_ahead(user, recorder.page)

    # When the annotator leaves the page
    recorder.page.goto(f"{live_server.url}/")

    # Then the held item goes back and the other annotator is served it
    deadline = time.monotonic() + 10
    while Assignment.objects.get(pk=held.pk).status == Assignment.Status.LEASED:
        assert time.monotonic() < deadline, "the held item was not released"
        time.sleep(0.05)
    assert Assignment.objects.get(pk=held.pk).status == Assignment.Status.EXPIRED
    theirs = _open(make_page, live_server, project, other, prefetch="0")
    shown = int(theirs.page.get_attribute("#item", "data-assignment"))
    assert Assignment.objects.get(pk=shown).item_id == held.item_id


@pytest.mark.parametrize("touch", [False, True], ids=["mouse", "touch"])
def test_mouse_and_touch_on_the_second_item(make_page, live_server, touch):
    project = make_project(name="Prefetch pointer", overlap=1)
    user = make_user("ann-pointer")
    add_member(project, user)
    make_items(project, 3)
    options = {"width": 390, "height": 844, "has_touch": True, "is_mobile": True} if touch else {}
    recorder = _open(make_page, live_server, project, user, **options)
    page = recorder.page

    def act(locator):
        return locator.tap() if touch else locator.click()

    ids = []
    for choice in ("A", "B"):
        _held_ahead(user, page)
        ids.append(page.get_attribute("#item", "data-assignment"))
        act(page.locator(f"label.choice-{choice}"))
        act(page.locator("#submit-btn"))
        # The next item is on screen at once, the answer held with Undo offered
        page.wait_for_function(
            "(old) => document.getElementById('item').dataset.assignment !== old", arg=ids[-1]
        )
        page.wait_for_selector("#undo-btn:not([hidden])")
    # Submitting the second sent the first at once; the second waits out its hold
    deadline = time.monotonic() + 15
    while Judgment.objects.filter(annotator=user).count() < 2:
        assert time.monotonic() < deadline, "answers were not sent"
        time.sleep(0.1)
    stored = {str(j.assignment_id): j.shown_choice for j in Judgment.objects.filter(annotator=user)}
    assert stored == {ids[0]: "A", ids[1]: "B"}
    recorder.assert_clean()


def test_without_prefetch_the_next_item_comes_with_the_submit(make_page, live_server):
    project = make_project(name="One round trip", overlap=1)
    user = make_user("ann-one-trip")
    add_member(project, user)
    make_items(project, 2)
    recorder = _open(make_page, live_server, project, user, prefetch="0")
    page = recorder.page
    first = page.get_attribute("#item", "data-assignment")
    seen = _requests(page)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    page.wait_for_selector("#undo-btn:not([hidden])")
    page.keyboard.press("Enter")  # send now
    page.wait_for_function(
        "(old) => document.getElementById('item').dataset.assignment !== old", arg=first
    )
    assert [url for url in seen if "/api/" in url or "/annotate/" in url] == [
        f"{page.url.split('/projects/')[0]}/api/assignments/{first}/submit/"
    ]
    assert not Assignment.objects.filter(ahead=True).exists()
    recorder.assert_clean()


def test_skip_during_the_hold_sends_the_previous_answer_first(make_page, live_server):
    project = make_project(name="Prefetch skip", overlap=1)
    user = make_user("ann-skip")
    add_member(project, user)
    make_items(project, 4)
    recorder = _open(make_page, live_server, project, user)
    page = recorder.page
    first = page.get_attribute("#item", "data-assignment")
    held = _held_ahead(user, page)
    page.keyboard.press("2")
    page.evaluate(ENTER_AND_READ)

    # When the annotator asks to skip the new item while the previous answer is held
    page.keyboard.press("k")

    # Then no dialog opens yet: the previous answer goes at once and is stored
    assert not page.is_visible("#skip-dialog")
    assert "previous answer first" in page.inner_text("#save-status")
    deadline = time.monotonic() + 4  # well inside the 5-second hold
    while not Judgment.objects.filter(assignment_id=first).exists():
        assert time.monotonic() < deadline, "the previous answer was not sent at once"
        time.sleep(0.05)

    # and a second K opens the dialog for the item on screen, which is skipped
    page.wait_for_function(HOLDS_AHEAD)
    page.keyboard.press("k")
    page.wait_for_selector("#skip-dialog[open]")
    page.locator("#skip-dialog input[name='reason']").first.check()
    page.locator("#skip-dialog button[type='submit']").click()
    page.wait_for_function(
        "(old) => document.getElementById('item').dataset.assignment !== old", arg=str(held.pk)
    )
    assert Assignment.objects.get(pk=held.pk).status == Assignment.Status.SKIPPED
    # The item held ahead became the current one; the page holds another, not the one shown
    shown = page.get_attribute("#item", "data-assignment")
    page.wait_for_function(
        "(shown) => { const a = document.getElementById('task').dataset.ahead;"
        " return Boolean(a) && a !== shown; }",
        arg=shown,
    )
    assert Assignment.objects.get(pk=page.get_attribute("#task", "data-ahead")).ahead
    recorder.assert_clean()
