"""Layout at 1280 and 360 px: nothing overlaps, Submit and confidence words in reach."""

import pytest

from tests.browser.conftest import login, screenshot
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""
LONG_ANSWER = ("A long answer that keeps going with ordinary words and more detail. " * 30)[:2000]


def _overlap(a, b) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def _boxes(page, selector):
    return [box for box in (el.bounding_box() for el in page.query_selector_all(selector)) if box]


def test_ranking_at_1280_with_a_long_answer_has_no_overlap(make_page, live_server):
    project = make_project(name="Long ranking", task_kind="ranking", k=4, allow_tie=True)
    annotator = make_user("ann-long")
    add_member(project, annotator)
    (item,) = make_items(project, 1)
    for slot in item.slots.select_related("candidate"):
        slot.candidate.text = LONG_ANSWER if slot.position == 2 else slot.candidate.text
        slot.candidate.save()
    recorder = make_page(width=1280, height=800)
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#ranking")

    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    for scroll_to in ("#item", ".candidates", "#ranking", "#submit-btn"):
        page.locator(scroll_to).scroll_into_view_if_needed()
        panel = page.locator(".shortcuts").bounding_box()
        assert panel and panel["x"] + panel["width"] <= 1280
        covered = [
            box
            for box in _boxes(page, ".candidate, .rank-card button, .rank-card, #submit-btn")
            if _overlap(panel, box)
        ]
        assert covered == [], f"the keyboard panel covers {covered}"
    screenshot(page, "ranking-1280-long")
    recorder.assert_clean()


def _in_viewport(page, selector, height):
    box = page.locator(selector).bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height


def test_phone_keeps_submit_in_reach_and_names_confidence_levels(make_page, live_server):
    project = make_project(
        name="Phone pairwise", ask_confidence=True, ask_strength=True, ask_rationale=True
    )
    annotator = make_user("ann-360")
    add_member(project, annotator)
    items = make_items(project, 2)
    for item in items:
        for slot in item.slots.select_related("candidate"):
            slot.candidate.text += "\n\n" + LONG_ANSWER[:700]
            slot.candidate.save()
    recorder = make_page(width=360, height=780)
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    assert "{#" not in page.inner_text("body")

    # Submit is on screen without scrolling, and nothing lies over it.
    assert page.evaluate("window.scrollY") == 0
    assert _in_viewport(page, "#submit-btn", 780)
    assert page.evaluate(
        """() => {
          const b = document.getElementById("submit-btn").getBoundingClientRect();
          const hit = document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2);
          return hit && hit.closest("#submit-btn") !== null;
        }"""
    )
    screenshot(page, "pairwise-360-top")

    # Each confidence level shows its word, not only a number.
    words = page.locator(".confidence-group .choice-sub")
    assert words.count() == 5
    for index in range(5):
        assert words.nth(index).is_visible()
    shown = " ".join(words.all_inner_texts()).lower()
    assert "guess" in shown and "certain" in shown
    # Single words stay whole (no "Guessin / g").
    for index in (0, 1, 3, 4):
        assert words.nth(index).evaluate("el => el.getClientRects().length") == 1
    for box in _boxes(page, ".confidence-group .btn-choice"):
        assert box["x"] >= 0 and box["x"] + box["width"] <= 360

    # After a save the "Saved" message sits in the action bar, not over the item's text.
    assignment_id = page.get_attribute("#item", "data-assignment")
    page.locator("label.choice-B").click()
    page.locator("#submit-btn").click()
    page.locator("#submit-btn").click()
    page.wait_for_function(NEXT_ITEM, arg=assignment_id)
    page.wait_for_function("() => document.getElementById('save-status').textContent === 'Saved'")
    toast = page.locator("#save-status").bounding_box()
    bar = page.locator(".task-bar").bounding_box()
    assert toast and bar
    assert bar["x"] <= toast["x"] and toast["x"] + toast["width"] <= bar["x"] + bar["width"]
    assert bar["y"] <= toast["y"] and toast["y"] + toast["height"] <= bar["y"] + bar["height"]
    assert _in_viewport(page, "#save-status", 780)
    assert _in_viewport(page, "#submit-btn", 780)
    for box in _boxes(page, "#submit-btn, #skip-btn"):
        assert not _overlap(toast, box)
    screenshot(page, "pairwise-360-saved")

    # At the end of the page nothing is hidden under the bar.
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    page.wait_for_timeout(100)
    bar = page.locator(".task-bar").bounding_box()
    content = _boxes(page, ".prompt, .candidate, .choice-group, #rationale")
    assert [box for box in content if _overlap(bar, box)] == []
    recorder.assert_clean()
