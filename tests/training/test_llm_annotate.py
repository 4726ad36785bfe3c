"""`manage.py llm_annotate`: an LLM judge labels rounds through the HTTP API as source "ai".

The web app is the real one (live_server); the judge is the real `transformers serve` process
(tiny random GPT-2, noise replies) behind a relay that counts what is sent, or a loopback
`http.server` whose replies the test controls.
"""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import CommandError, call_command

from annotation.imports import content_hash
from annotation.models import (
    Assignment,
    Candidate,
    Item,
    ItemCandidate,
    Judgment,
    Project,
    Prompt,
    Round,
    Skip,
)
from tests.training.conftest import free_port
from tests.training.test_generation_faults import completion, http_server
from tests.training.test_llm_judge import content_judge, fixed_reply, forwarding_to
from training.judging import parse_verdict
from training.llm_annotator import llm_annotator_username

pytestmark = pytest.mark.django_db(transaction=True)

N_ITEMS = 4


def _project(
    name: str = "llm", *, task_kind: str = "pairwise", allow_tie: bool = True, rubric: str = ""
) -> Project:
    """Return a project whose item i has the answer holding "good" at position i % k."""
    k = 2 if task_kind == "pairwise" else 3
    project = Project.objects.create(
        name=name,
        task_kind=task_kind,
        k=k,
        overlap=1,
        allow_tie=allow_tie,
        rubric=rubric,
    )
    round_ = Round.objects.create(project=project, number=1)
    for i in range(N_ITEMS):
        text = f"What is {i} + 1?"
        prompt = Prompt.objects.create(project=project, text=text, content_hash=content_hash(text))
        item = Item.objects.create(project=project, round=round_, prompt=prompt)
        texts = [f"bad {i}", f"meh {i}!"][: k - 1]
        texts.insert(i % k, f"good {i}!!")
        for position, answer in enumerate(texts):
            candidate = Candidate.objects.create(
                prompt=prompt, text=answer, content_hash=content_hash(f"{i}:{answer}")
            )
            ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
    return project


def _declare(settings, tmp_path, **endpoints) -> None:
    settings.ARTIFACT_ROOT = tmp_path
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        name: {"models": ["judge"], "retries": 0, "timeout_seconds": 10, **entry}
        for name, entry in endpoints.items()
    }


def _annotate(project: Project, url: str, endpoint: str, *args: str, model: str = "judge"):
    call_command(
        "llm_annotate",
        "--project",
        str(project.pk),
        "--url",
        url,
        "--endpoint",
        endpoint,
        "--model",
        model,
        *args,
    )


def _audit(tmp_path, project: Project, endpoint: str, model: str = "judge") -> list[dict]:
    name = llm_annotator_username(endpoint=endpoint, model=model)
    path = tmp_path / "llm_judges" / f"project-{project.pk}" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_real_served_judge_labels_every_item_through_the_api_once(
    live_server, settings, served_policy, tmp_path
):
    base_url, model = served_policy
    project = _project(rubric="Prefer correct sums.")
    with http_server(forwarding_to(base_url)) as (relay, log):
        _declare(settings, tmp_path, served={"base_url": relay, "models": [model]})
        settings.PREFLOOP_GENERATION_ENDPOINTS["served"]["timeout_seconds"] = 120
        _annotate(project, live_server.url, "served", "--max-new-tokens", "6", model=model)
        assert len(log["bodies"]) == 2 * N_ITEMS  # every item asked in both orders
        assert all("Prefer correct sums." in b["messages"][0]["content"] for b in log["bodies"])

        username = llm_annotator_username(endpoint="served", model=model)
        judgments = Judgment.objects.filter(project=project)
        assert set(judgments.values_list("source", flat=True)) <= {"ai"}
        assert set(judgments.values_list("annotator__username", flat=True)) <= {username}
        # Random replies: each item is labelled (agreed verdict or a tie) per the recorded
        # exchanges; "tie" is the default for disagreement and unreadable replies.
        records = _audit(tmp_path, project, "served", model)
        assert len(records) == N_ITEMS
        for record in records:
            (verdict,) = record["verdicts"]
            assert [e["reply"] for e in verdict["exchanges"]]
            replies = [parse_verdict(e["reply"]) for e in verdict["exchanges"]]
            expected = "tie" if verdict["outcome"] != "agreed" else verdict["winner"]
            assert verdict["outcome"] != "unparseable" or None in replies
            assert record["judge"]["model"] == model and record["http_status"] == 201
            judgment = Judgment.objects.get(assignment_id=record["assignment_id"])
            assert judgment.shown_choice == expected
        assert judgments.count() == N_ITEMS
        assert judgments.first().annotator.last_name == f"LLM judge served:{model}"[:150]

        # A repeat run finds nothing new: no request to the judge, no new label.
        _annotate(project, live_server.url, "served", "--max-new-tokens", "6", model=model)
        assert len(log["bodies"]) == 2 * N_ITEMS
        assert Judgment.objects.filter(project=project).count() == N_ITEMS


def test_labels_follow_the_answers_whatever_side_they_were_shown_on(
    live_server, settings, tmp_path
):
    project = _project()
    with http_server(content_judge(prefers="good")) as (url, log):
        _declare(settings, tmp_path, consistent={"base_url": url})
        _annotate(project, live_server.url, "consistent")
    judgments = Judgment.objects.filter(project=project).select_related("item__prompt")
    assert judgments.count() == N_ITEMS and len(log["bodies"]) == 2 * N_ITEMS
    for judgment in judgments:
        i = int(judgment.item.prompt.text.split()[2])
        assert judgment.choice == "AB"[i % 2]  # stored canonically: A is position 0
        assert judgment.source == "ai"


def test_disagreeing_orders_are_skipped_with_the_reason_or_tied(live_server, settings, tmp_path):
    skipping, tying, no_ties = _project("skip"), _project("tie"), _project("no", allow_tie=False)
    with http_server(fixed_reply("Answer A is better. [[A]]")) as (url, log):
        _declare(settings, tmp_path, biased={"base_url": url})
        _annotate(skipping, live_server.url, "biased", "--on-disagreement", "skip")
        assert not Judgment.objects.filter(project=skipping).exists()
        reasons = set(
            Skip.objects.filter(assignment__project=skipping).values_list("reason", flat=True)
        )
        assert reasons == {"LLM judge biased:judge: the two display orders gave different verdicts"}
        # skipped items are not served to the judge again
        sent = len(log["bodies"])
        _annotate(skipping, live_server.url, "biased", "--on-disagreement", "skip")
        assert len(log["bodies"]) == sent and Skip.objects.count() == N_ITEMS

        _annotate(tying, live_server.url, "biased")
        assert (
            list(Judgment.objects.filter(project=tying).values_list("choice", flat=True))
            == ["tie"] * N_ITEMS
        )

        _annotate(no_ties, live_server.url, "biased")
        assert not Judgment.objects.filter(project=no_ties).exists()
        assert Skip.objects.filter(assignment__project=no_ties).count() == N_ITEMS


def test_rankings_come_from_copeland_scores_of_all_pairs(live_server, settings, tmp_path):
    def by_exclamations(handler, body):
        from tests.training.test_llm_judge import _shown_answers

        a, b = _shown_answers(body)
        verdict = "[[A]]" if a.count("!") > b.count("!") else "[[B]]"
        return 200, json.dumps(completion(verdict)).encode()

    project = _project(task_kind="ranking", allow_tie=False)
    with http_server(by_exclamations) as (url, log):
        _declare(settings, tmp_path, ranker={"base_url": url})
        _annotate(project, live_server.url, "ranker")
    assert len(log["bodies"]) == N_ITEMS * 3 * 2  # 3 pairs per item, both orders
    for judgment in Judgment.objects.filter(project=project).select_related("item__prompt"):
        i = int(judgment.item.prompt.text.split()[2])
        # positions hold "bad", "meh !" with "good !!" inserted at i % 3 (see _project)
        expected = [3, 2]
        expected.insert(i % 3, 1)
        assert judgment.ranking == expected
        assert judgment.source == "ai"


def test_a_failing_judge_submits_nothing(live_server, settings, tmp_path):
    project = _project()
    with http_server(lambda handler, body: (200, b"<html>gateway</html>")) as (url, _):
        _declare(
            settings,
            tmp_path,
            garbled={"base_url": url},
            down={"base_url": f"http://127.0.0.1:{free_port()}"},
        )
        for endpoint, message in (("down", "does not answer"), ("garbled", "not valid JSON")):
            with pytest.raises(CommandError, match=message):
                _annotate(project, live_server.url, endpoint)
    assert not Judgment.objects.exists() and not Skip.objects.exists()
    # the item the judge was on stays leased to it, to be served back on its next run
    assert Assignment.objects.filter(status=Assignment.Status.LEASED).count() == 2

    with pytest.raises(CommandError, match="Prefloop does not answer at"):
        _annotate(project, f"http://127.0.0.1:{free_port()}", "down")
    with pytest.raises(CommandError, match="endpoint: no endpoint named 'http://x'"):
        _annotate(project, live_server.url, "http://x")
    with pytest.raises(CommandError, match="No project"):
        call_command(
            "llm_annotate", "--project", "999999", "--endpoint", "down", "--model", "judge"
        )


def test_a_judge_slower_than_the_lease_keeps_its_item(live_server, settings, tmp_path):
    project = _project()
    project.lease_seconds = 10
    project.save()
    Item.objects.filter(project=project).exclude(
        pk=Item.objects.filter(project=project).order_by("pk").first().pk
    ).delete()
    judge = content_judge(prefers="good")

    def slow(handler, body):
        time.sleep(project.lease_seconds + 2)
        return judge(handler, body)

    with http_server(slow) as (url, log):
        _declare(settings, tmp_path, slow={"base_url": url, "timeout_seconds": 60})
        _annotate(project, live_server.url, "slow")
    (judgment,) = Judgment.objects.filter(project=project)
    assert judgment.choice == "A" and judgment.source == "ai" and len(log["bodies"]) == 2
    (record,) = _audit(tmp_path, project, "slow")
    assert record["http_status"] == 201
