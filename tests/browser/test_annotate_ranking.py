"""K-way ranking in a real browser: drag with SortableJS, keyboard moves and ties.

Item 1 is answered with item 2 held ahead (prefetch): Submit shows item 2 at once and the
ranking is sent after its hold; item 2, the last, is held on screen and sent with Enter again.
"""

import pytest

from annotation.models import Assignment, ItemCandidate, Judgment
from tests.browser.conftest import held_ahead, login, screenshot, wait_for_judgment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SECRET_MODELS = ("okapi-secret-1", "narwhal-secret-2", "axolotl-secret-3", "pangolin-secret-4")
SECRETS = (*SECRET_MODELS, "ckpt-okapi", "ckpt-narwhal", "gold", "temperature")

NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""


def _dom_order(page) -> list[str]:
    return page.eval_on_selector_all(
        "#ranking .rank-card", "cards => cards.map(c => c.dataset.slot)"
    )


def _dom_ranks(page) -> list[int]:
    """Return the rank shown for each display slot A, B, C, ..."""
    by_slot = page.eval_on_selector_all(
        "#ranking .rank-card",
        "cards => Object.fromEntries(cards.map(c => [c.dataset.slot, Number(c.dataset.rank)]))",
    )
    return [by_slot[slot] for slot in sorted(by_slot)]


def _assert_stored(assignment_id: str, shown_ranks: list[int], page_first_lines: dict):
    assignment = Assignment.objects.get(pk=assignment_id)
    judgment = Judgment.objects.get(assignment=assignment)
    expected = [0] * len(shown_ranks)
    for slot_index, rank in enumerate(shown_ranks):
        expected[assignment.display_order[slot_index]] = rank
    assert judgment.ranking == expected
    assert judgment.shown_choice == ",".join(map(str, shown_ranks))
    assert judgment.time_spent_ms > 0
    # The text shown under each letter is the candidate at that canonical position.
    for slot_index, slot in enumerate(sorted(page_first_lines)):
        position = ItemCandidate.objects.get(
            item_id=assignment.item_id, candidate__text=page_first_lines[slot]
        ).position
        assert position == assignment.display_order[slot_index]


def _first_lines(page) -> dict:
    return page.eval_on_selector_all(
        ".candidate",
        "cs => Object.fromEntries(cs.map(c => "
        "[c.dataset.slot, c.querySelector('.candidate-body').innerText.trim()]))",
    )


def test_ranking_by_drag_and_by_keyboard(make_page, live_server):
    project = make_project(
        name="Rank four answers",
        task_kind="ranking",
        k=4,
        allow_tie=True,
        overlap=1,
        rubric="Rank from best to worst. Give equal ranks only when truly equal.",
    )
    annotator = make_user("ann-ranking")
    add_member(project, annotator)
    make_items(project, 2, models=SECRET_MODELS)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#ranking")

    # Item 1: by mouse, drag the last card to the top.
    first_id = page.get_attribute("#item", "data-assignment")
    second_held = held_ahead(page, annotator)
    assert second_held
    lines = _first_lines(page)
    page.keyboard.press("Enter")  # untouched order: asks for a confirmation instead
    assert "not moved any card" in page.inner_text("#save-status")
    page.locator('.rank-card[data-slot="D"]').drag_to(page.locator('.rank-card[data-slot="A"]'))
    assert _dom_order(page) == ["D", "A", "B", "C"]
    ranks = _dom_ranks(page)
    assert ranks == [2, 3, 4, 1]
    assert page.inner_text('.rank-badge[data-rank-for="D"]') == "Rank 1"
    page.locator("#submit-btn").click()
    # The item held ahead is on screen at once; the ranking waits out its hold off screen.
    assert page.get_attribute("#item", "data-assignment") == second_held
    page.wait_for_selector("#undo-btn:not([hidden])")
    assert not Judgment.objects.filter(assignment_id=first_id).exists()
    wait_for_judgment(first_id)
    _assert_stored(first_id, ranks, lines)
    page.wait_for_selector("#undo-btn", state="hidden")

    # Item 2: keyboard only. C to the top, D up one place, then D tied with the card above.
    second_id = page.get_attribute("#item", "data-assignment")
    assert second_id == second_held
    assert held_ahead(page, annotator) is None  # the last item: nothing more to hold
    lines = _first_lines(page)
    page.keyboard.press("c")
    page.keyboard.press("1")
    page.keyboard.press("d")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("=")
    assert _dom_order(page) == ["C", "A", "D", "B"]
    ranks = _dom_ranks(page)
    assert ranks == [2, 3, 1, 2]
    assert page.get_attribute('.rank-card[data-slot="D"]', "aria-label") == (
        "Response D, rank 2, same rank as the card above"
    )
    screenshot(page, "ranking-desktop")
    page.keyboard.press("Enter")
    page.wait_for_selector("#undo-btn:not([hidden])")
    page.keyboard.press("Enter")  # send now
    page.wait_for_function(NEXT_ITEM, arg=second_id)
    _assert_stored(second_id, ranks, lines)
    page.wait_for_selector("#item-done")

    recorder.assert_clean()
    recorder.assert_no_secret(SECRETS)


def test_ranking_fits_a_phone(make_page, live_server):
    project = make_project(name="Rank on a phone", task_kind="ranking", k=3, allow_tie=True)
    annotator = make_user("ann-phone")
    add_member(project, annotator)
    make_items(project, 1)
    recorder = make_page(width=360, height=780)
    login(recorder, live_server, annotator.username)
    recorder.page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    recorder.page.wait_for_selector("#ranking")
    assert recorder.page.evaluate("document.documentElement.scrollWidth") <= 360
    recorder.page.locator('.rank-card[data-slot="C"] .move-btn[data-move="-1"]').click()
    assert _dom_order(recorder.page) == ["A", "C", "B"]
    screenshot(recorder.page, "ranking-360")
    recorder.assert_clean()
