"""In Chromium: the Models page's policy samples (scatter, lines, escaped answers) draw.

Uses the lineage of tests/console/test_policy_samples.py (tiny policies evaluated by the
loop's real `policy_evaluate`), one of whose answers is a script that must stay text.
"""

import os

import numpy as np
import pytest

from tests.browser.conftest import CHROMIUM, login, screenshot
from tests.console.test_policy_samples import (  # noqa: F401  (fixtures)
    SCRIPT_ANSWER,
    lineage,
)
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and models)
    tiny_policy_dir,
    tiny_reward_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training.models import PolicyEvaluation

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

ALL_DRAWN = """() => {
  const charts = document.querySelectorAll("[data-chart]");
  return charts.length > 0 && [...charts].every((el) => el.dataset.drawn === "true");
}"""


def test_policy_samples_draw_and_keep_model_text_as_text(make_page, live_server, lineage):  # noqa: F811
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    project, _base, child, grandchild, _reward, researcher = lineage
    judge = PolicyEvaluation.objects.get(
        policy=grandchild, opponent=child, judge_kind="reward_model"
    )
    top = int(np.argmax(judge.details["scores_new"]))
    grandchild.eval_results["generation"]["samples"][top]["answer"] = SCRIPT_ANSWER
    grandchild.save(update_fields=["eval_results"])
    recorder = make_page(width=1400, height=1000)
    login(recorder, live_server, researcher.username)
    page = recorder.page
    page.goto(f"{live_server.url}/dashboard/projects/{project.pk}/models/")
    page.wait_for_function(ALL_DRAWN)

    for key in ("policy-reward-kl", "policy-text-stats"):
        assert page.locator(f"#panel-{key} [data-chart] canvas").count() == 1, key
    # The script is shown as the answer's text and never ran.
    first = page.locator("#panel-policy-top-reward .sample-text").first
    assert first.inner_text() == SCRIPT_ANSWER
    assert page.evaluate("() => document.querySelectorAll('.sample-text script').length") == 0
    screenshot(page, "dashboard-policy-samples")

    # Another version through the picker: the child next to the base.
    page.select_option("#policy-select", str(child.pk))
    page.get_by_role("button", name="Show").first.click()
    page.wait_for_function(ALL_DRAWN)
    models = page.locator("#panel-policy-vs-previous .sample-model")
    assert models.nth(0).text_content().startswith("base · reward")
    assert models.nth(1).text_content().startswith("child · reward")
    recorder.assert_clean()
    assert [e for e in recorder.console_errors if "favicon" not in e] == []
