"""Mouse and touch on the second and later items: one click is one action, with hold and undo."""

import time

import pytest

from annotation.models import Assignment, Judgment
from tests.browser.conftest import login, screenshot
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""


def _open_task(recorder, live_server, project, username):
    login(recorder, live_server, username)
    recorder.page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    recorder.page.wait_for_selector("#item")


def _hold_undo_and_resubmit(page, act):
    """Choose A, submit, undo within the hold, choose B, submit and let the hold run out.

    `act(locator)` is a mouse click or a touch tap. Return the item's id and the seconds from
    the second submit to the next item.
    """
    assignment_id = page.get_attribute("#item", "data-assignment")
    act(page.locator("label.choice-A"))
    act(page.locator("#submit-btn"))
    # The answer is held in the browser: Undo is offered and nothing reached the server.
    page.wait_for_selector("#undo-btn:not([hidden])")
    assert "Submitting in" in page.inner_text("#save-status")
    page.wait_for_timeout(1000)
    assert page.get_attribute("#item", "data-assignment") == assignment_id
    assert not Judgment.objects.filter(assignment_id=assignment_id).exists()
    act(page.locator("#undo-btn"))
    page.wait_for_selector("#undo-btn", state="hidden")
    assert "Undone" in page.inner_text("#save-status")
    assert page.is_enabled('input[name="choice"][value="B"]')

    act(page.locator("label.choice-B"))
    act(page.locator(".strength-group label.choice", has_text="Much better"))
    started = time.monotonic()
    act(page.locator("#submit-btn"))
    page.wait_for_selector("#undo-btn:not([hidden])")
    page.wait_for_function(NEXT_ITEM, arg=assignment_id, timeout=15_000)
    return assignment_id, time.monotonic() - started


def _assert_one_judgment(assignment_id, shown_choice, strength):
    judgments = list(Judgment.objects.filter(assignment_id=assignment_id))
    assert len(judgments) == 1
    assert (judgments[0].shown_choice, judgments[0].strength) == (shown_choice, strength)
    assert Assignment.objects.get(pk=assignment_id).status == Assignment.Status.SUBMITTED


def test_mouse_only_pairwise_holds_and_undoes_on_every_item(make_page, live_server):
    project = make_project(name="Mouse pairwise", ask_strength=True, overlap=1)
    annotator = make_user("ann-mouse")
    add_member(project, annotator)
    make_items(project, 3)
    recorder = make_page()
    page = recorder.page
    _open_task(recorder, live_server, project, annotator.username)

    for _ in range(3):
        assignment_id, held_for = _hold_undo_and_resubmit(page, lambda locator: locator.click())
        # The full 5-second hold ran before the answer was sent.
        assert held_for >= 4.5
        _assert_one_judgment(assignment_id, "B", "much")
    assert page.locator("#item-done").is_visible()
    assert Judgment.objects.filter(annotator=annotator).count() == 3
    recorder.assert_clean()


def test_mouse_send_now_on_a_later_item(make_page, live_server):
    project = make_project(name="Mouse send now", overlap=1)
    annotator = make_user("ann-mouse-now")
    add_member(project, annotator)
    make_items(project, 2)
    recorder = make_page()
    page = recorder.page
    _open_task(recorder, live_server, project, annotator.username)
    for _ in range(2):
        assignment_id = page.get_attribute("#item", "data-assignment")
        page.locator("label.choice-tie").click()
        page.locator("#submit-btn").click()
        page.wait_for_selector("#undo-btn:not([hidden])")
        assert page.inner_text("#submit-btn").startswith("Send now")
        started = time.monotonic()
        page.locator("#submit-btn").click()
        page.wait_for_function(NEXT_ITEM, arg=assignment_id)
        assert time.monotonic() - started < 4
        assert Judgment.objects.get(assignment_id=assignment_id).shown_choice == "tie"
    recorder.assert_clean()


def test_touch_pairwise_holds_and_undoes_on_a_later_item(make_page, live_server):
    project = make_project(name="Touch pairwise", ask_strength=True, overlap=1)
    annotator = make_user("ann-touch")
    add_member(project, annotator)
    make_items(project, 2)
    recorder = make_page(width=390, height=844, has_touch=True, is_mobile=True)
    page = recorder.page
    _open_task(recorder, live_server, project, annotator.username)

    for served in range(2):
        assignment_id, held_for = _hold_undo_and_resubmit(page, lambda locator: locator.tap())
        assert held_for >= 4.5
        _assert_one_judgment(assignment_id, "B", "much")
        if served == 0:
            screenshot(page, "pairwise-touch-second-item")
    assert page.locator("#item-done").is_visible()
    recorder.assert_clean()


def _dom_order(page) -> list[str]:
    return page.eval_on_selector_all("#ranking .rank-card", "cs => cs.map(c => c.dataset.slot)")


def _dom_ranks(page) -> list[int]:
    by_slot = page.eval_on_selector_all(
        "#ranking .rank-card",
        "cs => Object.fromEntries(cs.map(c => [c.dataset.slot, Number(c.dataset.rank)]))",
    )
    return [by_slot[slot] for slot in sorted(by_slot)]


def _button(page, slot, kind):
    selector = {"up": '.move-btn[data-move="-1"]', "down": '.move-btn[data-move="1"]'}
    selector["tie"] = ".tie-toggle"
    return page.locator(f'.rank-card[data-slot="{slot}"] {selector[kind]}')


def _submit_ranking(page, shown_ranks):
    assignment_id = page.get_attribute("#item", "data-assignment")
    page.locator("#submit-btn").click()
    page.wait_for_selector("#undo-btn:not([hidden])")
    page.locator("#submit-btn").click()  # send now
    page.wait_for_function(NEXT_ITEM, arg=assignment_id)
    assignment = Assignment.objects.get(pk=assignment_id)
    expected = [0] * len(shown_ranks)
    for slot_index, rank in enumerate(shown_ranks):
        expected[assignment.display_order[slot_index]] = rank
    judgments = list(Judgment.objects.filter(assignment=assignment))
    assert len(judgments) == 1
    assert judgments[0].ranking == expected
    assert judgments[0].shown_choice == ",".join(map(str, shown_ranks))


def test_ranking_buttons_move_one_place_on_later_items(make_page, live_server):
    project = make_project(
        name="Rank by buttons", task_kind="ranking", k=4, allow_tie=True, overlap=1
    )
    annotator = make_user("ann-rank-buttons")
    add_member(project, annotator)
    make_items(project, 3)
    recorder = make_page()
    page = recorder.page
    _open_task(recorder, live_server, project, annotator.username)

    # Item 1.
    _button(page, "B", "down").click()
    assert _dom_order(page) == ["A", "C", "B", "D"]
    _submit_ranking(page, [1, 3, 2, 4])

    # Item 2: an untouched order asks for a confirmation first.
    page.locator("#submit-btn").click()
    assert "not moved any card" in page.inner_text("#save-status")
    assert page.locator("#undo-btn").is_hidden()
    # One click on ↑ moves D one place; "= above" ties it with the card above.
    _button(page, "D", "up").click()
    assert _dom_order(page) == ["A", "B", "D", "C"]
    _button(page, "D", "tie").click()
    assert page.get_attribute('.rank-card[data-slot="D"] .tie-toggle', "aria-pressed") == "true"
    ranks = _dom_ranks(page)
    assert ranks == [1, 2, 3, 2]
    _submit_ranking(page, ranks)

    # Item 3: ↓ once, "= above" twice is no tie.
    _button(page, "A", "down").click()
    assert _dom_order(page) == ["B", "A", "C", "D"]
    _button(page, "C", "tie").click()
    _button(page, "C", "tie").click()
    assert page.get_attribute('.rank-card[data-slot="C"] .tie-toggle', "aria-pressed") == "false"
    ranks = _dom_ranks(page)
    assert ranks == [2, 1, 3, 4]
    _submit_ranking(page, ranks)
    assert page.locator("#item-done").is_visible()
    recorder.assert_clean()
