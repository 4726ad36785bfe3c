"""An annotator who skipped too much sees why in place of the item, with a way back."""

import pytest

from annotation.models import Assignment
from tests.browser.conftest import held_ahead, login, screenshot
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NEXT_ITEM = """(old) => {
  const el = document.getElementById("item");
  return !el || el.dataset.assignment !== old;
}"""


def test_spent_skip_budget_shows_the_servers_message(make_page, live_server):
    project = make_project(name="Skip budget", max_skips_in_row=2, overlap=1)
    annotator = make_user("ann-skipper")
    add_member(project, annotator)
    make_items(project, 4)
    recorder = make_page()
    page = recorder.page
    login(recorder, live_server, annotator.username)
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    page.wait_for_selector("#item")

    skipped, held = [], []
    for _ in range(2):
        assignment_id = page.get_attribute("#item", "data-assignment")
        held.append(held_ahead(page, annotator))  # the next item is held ahead (prefetch)
        page.locator("#skip-btn").click()
        page.wait_for_selector("#skip-dialog[open]")
        page.get_by_role("button", name="Skip item").click()
        page.wait_for_function(NEXT_ITEM, arg=assignment_id)
        skipped.append(assignment_id)

    # The server refuses a next item (429 skip_budget); its message replaces the item.
    notice = page.locator("#item-notice")
    assert notice.is_visible()
    assert "No more skips for now" in notice.inner_text()
    assert "You skipped 2 items in a row" in notice.inner_text()
    assert page.locator("#item").count() == 0
    assert page.locator("#item-actions").is_hidden()
    screenshot(page, "skip-budget-notice")
    assert all(Assignment.objects.get(pk=pk).status == Assignment.Status.SKIPPED for pk in skipped)
    # The item held ahead when the budget ran out was given back, not served past it.
    assert skipped[1] == held[0]
    assert Assignment.objects.get(pk=held[1]).status == Assignment.Status.EXPIRED
    assert not Assignment.objects.filter(
        annotator=annotator, status=Assignment.Status.LEASED
    ).exists()

    # The same on a fresh page load, and the way back leads to the project list.
    page.goto(f"{live_server.url}/projects/{project.pk}/annotate/")
    assert "You skipped 2 items in a row" in page.inner_text("#item-notice")
    page.get_by_role("link", name="Back to projects").click()
    page.wait_for_url(f"{live_server.url}/")
    recorder.assert_clean()
