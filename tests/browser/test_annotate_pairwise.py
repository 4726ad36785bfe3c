"""Pairwise annotation in a real browser: keyboard only, undo, skip, blind, no CSP violation.

The page holds the next item ahead (prefetch, on by default): Enter shows it in the same frame
while the answer waits out its hold; on the last item, nothing is held ahead and a second Enter
sends the held answer at once.
"""

import pytest

from annotation.models import Assignment, ItemCandidate, Judgment, Skip
from tests.browser.conftest import held_ahead, login, screenshot, wait_for_judgment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SECRET_MODELS = ("zebra-secret-model-7b", "quokka-hidden-model-70b")
SECRETS = (*SECRET_MODELS, "ckpt-zebra", "ckpt-quokka", "gold", "is_repeat", "temperature")

NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""


def _pairwise_project():
    project = make_project(
        name="Helpfulness pairwise",
        rubric="Prefer the **more helpful** answer.\n\n- Be strict about facts.\n- Ignore length.",
        ask_strength=True,
        ask_confidence=True,
        ask_rationale=True,
        overlap=1,
        gold_rate=0.25,
    )
    annotator = make_user("ann-pairwise")
    add_member(project, annotator)
    items = make_items(project, 5, models=SECRET_MODELS, gold=[None, None, None, None, "A"])
    # Realistic content: a chat transcript and answers with a code block.
    for item in items:
        item.prompt.messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "How do I reverse a list in Python?"},
        ]
        item.prompt.save()
        for slot in item.slots.select_related("candidate"):
            # Keep the factory's first line ("answer <position> to <n>"): the test maps by it.
            slot.candidate.text += (
                "\n\nUse slicing:\n\n```python\nitems = [1, 2, 3]\nprint(items[::-1])\n```\n"
                "This returns a **new** list." + (" It does not change `items`." * slot.position)
            )
            slot.candidate.save()
    return project, annotator


def _shown_first_lines(page) -> dict:
    return {
        slot: page.locator(f'.candidate[data-slot="{slot}"] .candidate-body')
        .inner_text()
        .splitlines()[0]
        for slot in "AB"
    }


def _send(page, assignment_id, ahead):
    """After Enter: the item held ahead is on screen at once and the answer is sent after its
    hold; with nothing held ahead, the answer is held on screen and Enter sends it now."""
    if ahead:
        assert page.get_attribute("#item", "data-assignment") == ahead
        assert "previous answer" in page.inner_text("#save-status")
        wait_for_judgment(assignment_id)
    else:
        page.wait_for_selector("#undo-btn:not([hidden])")
        assert "Submitting in" in page.inner_text("#save-status")
        page.keyboard.press("Enter")  # send now


def test_pairwise_by_keyboard_alone(make_page, live_server):
    project, annotator = _pairwise_project()
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    assert project.name in page.content()
    screenshot(page, "home")
    # Keyboard only from the project list: Tab to the Start link and press Enter.
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent").strip().startswith("Start"):
            break
    page.keyboard.press("Enter")
    page.wait_for_selector("#item")

    # A second, phone-sized window on the same (leased) item for the narrow-screen screenshot.
    phone = make_page(width=360, height=780)
    login(phone, live_server, annotator.username)
    # Without prefetch: closing it must not give back the item the main page holds ahead.
    phone.page.goto(f"{live_server.url}/projects/{project.pk}/annotate/?prefetch=0")
    phone.page.wait_for_selector("#item")
    assert phone.page.evaluate("document.documentElement.scrollWidth") <= 360
    screenshot(phone.page, "pairwise-360")
    phone.page.locator("label.choice-B").click()
    screenshot(phone.page, "pairwise-360-chosen")
    phone.assert_clean()
    phone.page.context.close()

    expected = {}
    plan = ["B-much", "A-undo-tie", "both_bad", "skip"]
    served = 0
    while page.locator("#item").count():
        assignment_id = page.get_attribute("#item", "data-assignment")
        ahead = held_ahead(page, annotator)
        texts = _shown_first_lines(page)
        action = plan[served % len(plan)]
        served += 1
        if action == "B-much":
            page.keyboard.press("2")
            page.keyboard.press("m")
            page.keyboard.press("Shift+Digit4")
            page.keyboard.press("r")
            page.keyboard.type("B explains the <slice> better.")
            page.keyboard.press("Escape")
            if served == 1:
                page.eval_on_selector("#rubric", "el => { el.open = true; }")
                screenshot(page, "pairwise-desktop")
            page.keyboard.press("Enter")
            _send(page, assignment_id, ahead)
            expected[assignment_id] = ("B", "much", 4, "B explains the <slice> better.", texts)
        elif action == "A-undo-tie":
            page.keyboard.press("a")
            page.keyboard.press("Enter")
            page.wait_for_selector("#undo-btn:not([hidden])")
            page.keyboard.press("u")
            page.wait_for_selector("#undo-btn", state="hidden")
            # The answered item is back (the next one held ahead again), ready to change.
            assert page.get_attribute("#item", "data-assignment") == assignment_id
            assert page.get_attribute("#task", "data-ahead") == (ahead or "")
            assert page.is_enabled('input[name="choice"][value="tie"]')
            page.keyboard.press("t")
            assert page.is_disabled('input[name="strength"][value="much"]')
            page.keyboard.press("Enter")  # and let the 5 s grace run out
            if ahead:
                assert page.get_attribute("#item", "data-assignment") == ahead
            screenshot(page, "pairwise-pending-undo")  # after U: a slow screenshot can outlast it
            wait_for_judgment(assignment_id)
            expected[assignment_id] = ("tie", "", None, "", texts)
        elif action == "both_bad":
            page.keyboard.press("x")
            page.keyboard.press("Shift+Digit2")
            page.keyboard.press("Enter")
            _send(page, assignment_id, ahead)
            expected[assignment_id] = ("both_bad", "", 2, "", texts)
        else:
            page.keyboard.press("k")
            page.wait_for_selector("#skip-dialog[open]")
            page.keyboard.press("ArrowDown")  # second reason
            page.keyboard.press("Enter")
            expected[assignment_id] = ("skip", "", None, "", texts)
        page.wait_for_function(NEXT_ITEM, arg=assignment_id, timeout=15_000)
        page.wait_for_selector("#undo-btn", state="hidden")

    page.wait_for_selector("#item-done")
    assert served >= 4

    for assignment_id, (shown, strength, confidence, rationale, texts) in expected.items():
        assignment = Assignment.objects.get(pk=assignment_id)
        # Slot letters map to canonical positions through the stored display order.
        for index, slot in enumerate("AB"):
            shown_slot = ItemCandidate.objects.get(
                item_id=assignment.item_id, candidate__text__startswith=texts[slot]
            )
            assert shown_slot.position == assignment.display_order[index]
        if shown == "skip":
            assert assignment.status == Assignment.Status.SKIPPED
            assert Skip.objects.get(assignment=assignment).reason == "Text is broken or unreadable"
            continue
        judgment = Judgment.objects.get(assignment=assignment)
        canonical = shown
        if shown in ("A", "B"):
            position = assignment.display_order["AB".index(shown)]
            canonical = "A" if position == 0 else "B"
        assert judgment.shown_choice == shown
        assert judgment.choice == canonical
        assert (judgment.strength, judgment.confidence, judgment.rationale) == (
            strength,
            confidence,
            rationale,
        )
        assert judgment.time_spent_ms and judgment.time_spent_ms > 0
        assert judgment.idempotency_key.startswith(f"web-{assignment_id}-")

    recorder.assert_clean()
    recorder.assert_no_secret(SECRETS)
