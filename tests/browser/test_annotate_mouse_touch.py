"""Mouse and touch on the second and later items: one click is one action, with hold and undo.

The page holds the next item ahead (prefetch, on by default): Submit shows it at once while the
answer waits out its 5-second hold off screen, and Undo brings the answered item back. The last
item has nothing held ahead, so its answer is held on screen with "Send now".
"""

import time

import pytest

from annotation.models import Assignment, Judgment
from tests.browser.conftest import held_ahead, login, screenshot, wait_for_judgment
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


def _shown(page) -> str | None:
    return page.get_attribute("#item", "data-assignment") if page.locator("#item").count() else None


def _hold_undo_and_resubmit(page, act, user):
    """Choose A, submit, undo within the hold, choose B, submit and let the hold run out.

    `act(locator)` is a mouse click or a touch tap. Return the item's id, the id of the item
    held ahead (None on the last item) and the seconds from the second submit to the stored
    answer.
    """
    assignment_id = page.get_attribute("#item", "data-assignment")
    ahead = held_ahead(page, user)
    act(page.locator("label.choice-A"))
    act(page.locator("#submit-btn"))
    # The answer is held in the browser: Undo is offered and nothing reached the server.
    page.wait_for_selector("#undo-btn:not([hidden])")
    if ahead:
        # The item held ahead is on screen at once; the answer waits off screen.
        assert _shown(page) == ahead
        assert "Submitting the previous answer in" in page.inner_text("#save-status")
    else:
        assert _shown(page) == assignment_id
        assert "Submitting in" in page.inner_text("#save-status")
    page.wait_for_timeout(1000)
    assert not Judgment.objects.filter(assignment_id=assignment_id).exists()
    act(page.locator("#undo-btn"))
    page.wait_for_selector("#undo-btn", state="hidden")
    assert "Undone" in page.inner_text("#save-status")
    assert _shown(page) == assignment_id
    assert page.is_enabled('input[name="choice"][value="B"]')
    if ahead:
        # The next item is held ahead again, under the same lease.
        assert page.get_attribute("#task", "data-ahead") == ahead
        assert Assignment.objects.get(pk=ahead).ahead

    act(page.locator("label.choice-B"))
    act(page.locator(".strength-group label.choice", has_text="Much better"))
    started = time.monotonic()
    act(page.locator("#submit-btn"))
    page.wait_for_selector("#undo-btn:not([hidden])")
    if ahead:
        assert _shown(page) == ahead
    wait_for_judgment(assignment_id)
    held_for = time.monotonic() - started
    page.wait_for_function(NEXT_ITEM, arg=assignment_id, timeout=15_000)
    page.wait_for_selector("#undo-btn", state="hidden")
    return assignment_id, ahead, held_for


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

    aheads = []
    for _ in range(3):
        assignment_id, ahead, held_for = _hold_undo_and_resubmit(
            page, lambda locator: locator.click(), annotator
        )
        aheads.append(ahead)
        # The full 5-second hold ran before the answer was sent.
        assert held_for >= 4.5
        _assert_one_judgment(assignment_id, "B", "much")
        if ahead:
            # The item held ahead became the current one once the answer was in.
            assert _shown(page) == ahead
            assert not Assignment.objects.get(pk=ahead).ahead
    assert None not in aheads[:2] and aheads[2] is None  # the last item has none ahead
    page.wait_for_selector("#item-done")
    assert Judgment.objects.filter(annotator=annotator).count() == 3
    recorder.assert_clean()


def test_mouse_send_now_on_a_later_item(make_page, live_server):
    project = make_project(name="Mouse send now", overlap=1)
    annotator = make_user("ann-mouse-now")
    add_member(project, annotator)
    make_items(project, 3)
    recorder = make_page()
    page = recorder.page
    _open_task(recorder, live_server, project, annotator.username)

    # Items 1 and 2: Submit shows the held item at once; answering it sends the previous
    # answer at once instead of after its hold.
    first = page.get_attribute("#item", "data-assignment")
    second = held_ahead(page, annotator)
    page.locator("label.choice-tie").click()
    page.locator("#submit-btn").click()
    assert _shown(page) == second
    assert page.inner_text("#submit-btn").startswith("Submit")
    page.locator("label.choice-A").click()
    started = time.monotonic()
    page.locator("#submit-btn").click()
    assert wait_for_judgment(first).shown_choice == "tie"
    assert time.monotonic() - started < 4

    # Item 3, the last: nothing is held ahead, so the answer waits on screen with Send now.
    page.wait_for_function(NEXT_ITEM, arg=second, timeout=15_000)
    third = page.get_attribute("#item", "data-assignment")
    assert held_ahead(page, annotator) is None
    assert wait_for_judgment(second).shown_choice == "A"
    page.locator("label.choice-B").click()
    page.locator("#submit-btn").click()
    page.wait_for_selector("#undo-btn:not([hidden])")
    assert page.inner_text("#submit-btn").startswith("Send now")
    started = time.monotonic()
    page.locator("#submit-btn").click()
    page.wait_for_function(NEXT_ITEM, arg=third)
    assert time.monotonic() - started < 4
    assert Judgment.objects.get(assignment_id=third).shown_choice == "B"
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
        assignment_id, ahead, held_for = _hold_undo_and_resubmit(
            page, lambda locator: locator.tap(), annotator
        )
        assert held_for >= 4.5
        assert (ahead is None) == (served == 1)
        _assert_one_judgment(assignment_id, "B", "much")
        if served == 0:
            screenshot(page, "pairwise-touch-second-item")
    page.wait_for_selector("#item-done")
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


def _submit_ranking(page, user, shown_ranks):
    assignment_id = page.get_attribute("#item", "data-assignment")
    ahead = held_ahead(page, user)
    page.locator("#submit-btn").click()
    page.wait_for_selector("#undo-btn:not([hidden])")
    if ahead:
        assert _shown(page) == ahead  # the held item at once; the answer waits its hold
    # The answer is sent when its hold runs out (Send now by mouse: test_mouse_send_now...).
    wait_for_judgment(assignment_id)
    page.wait_for_function(NEXT_ITEM, arg=assignment_id)
    page.wait_for_selector("#undo-btn", state="hidden")
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
    _submit_ranking(page, annotator, [1, 3, 2, 4])

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
    _submit_ranking(page, annotator, ranks)

    # Item 3: ↓ once, "= above" twice is no tie.
    _button(page, "A", "down").click()
    assert _dom_order(page) == ["B", "A", "C", "D"]
    _button(page, "C", "tie").click()
    _button(page, "C", "tie").click()
    assert page.get_attribute('.rank-card[data-slot="C"] .tie-toggle', "aria-pressed") == "false"
    ranks = _dom_ranks(page)
    assert ranks == [2, 1, 3, 4]
    _submit_ranking(page, annotator, ranks)
    page.wait_for_selector("#item-done")
    recorder.assert_clean()
