"""Dashboard: each AI annotator's agreement with the human majority, per round.

People and AI accounts label through the real annotation API (next, submit); the figures are
checked against counts made here and scikit-learn's Cohen's kappa.
"""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from rest_framework.test import APIClient
from sklearn.metrics import cohen_kappa_score

from annotation import services
from annotation.imports import content_hash
from annotation.models import Candidate, Item, ItemCandidate, Membership, Prompt
from config.console.dashboard.data import ProjectData
from config.console.dashboard.tabs.annotators import ai_agreement_panel
from evaluation.ai_agreement import ai_agreement_by_annotator
from tests.factories import add_member, make_project, make_round, make_user

pytestmark = pytest.mark.django_db

ROUND_SIZES = {1: 10, 2: 6}
JUDGE = "LLM judge hosted:judge-<b>model</b>"


def _world():
    """Return (project, rounds, the good answer's position per item id)."""
    project = make_project(overlap=5, allow_tie=True)
    good_position = {}
    rounds = {}
    for number, size in ROUND_SIZES.items():
        rounds[number] = round_ = make_round(project, number)
        for i in range(size):
            text = f"Round {number} question {i}?"
            prompt = Prompt.objects.create(
                project=project, text=text, content_hash=content_hash(text)
            )
            item = Item.objects.create(project=project, round=round_, prompt=prompt)
            answers = [f"bad {number}.{i}", f"good {number}.{i}"]
            if i % 2:
                answers.reverse()
            for position, answer in enumerate(answers):
                candidate = Candidate.objects.create(
                    prompt=prompt, text=answer, content_hash=content_hash(answer)
                )
                ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
            good_position[item.pk] = answers.index(f"good {number}.{i}")
    return project, rounds, good_position


def _label(project, user, pick) -> None:
    """Label every item served to `user` through the API; `pick(payload) -> slot index`."""
    client = APIClient()
    client.force_authenticate(user)
    while True:
        served = client.post(f"/api/projects/{project.pk}/next/")
        if served.status_code == 204:
            return
        assert served.status_code == 200, served.content
        payload = served.json()
        slot = pick(payload)
        body = {"choice": "AB"[slot] if slot in (0, 1) else slot}
        done = client.post(
            f"/api/assignments/{payload['assignment_id']}/submit/", body, format="json"
        )
        assert done.status_code == 201, done.content


def _good_slot(payload) -> int:
    return next(i for i, c in enumerate(payload["candidates"]) if c["text"].startswith("good"))


def _question(payload) -> tuple[int, int]:
    words = payload["prompt"]["text"].split()
    return int(words[1]), int(words[3].rstrip("?"))


def _ai_account(project, username: str):
    services.simulated_annotator_ensure(project=project, username=username, source="ai")
    user = get_user_model().objects.get(username=username)
    user.last_name = JUDGE
    user.save()
    return user


def test_each_ai_annotator_is_compared_with_the_human_majority_per_round(client):
    project, rounds, good_position = _world()
    humans = [make_user() for _ in range(3)]
    for human in humans:
        add_member(project, human)
    # two humans always pick the good answer; the third errs on round 1 questions 0 and 1
    _label(project, humans[0], _good_slot)
    _label(project, humans[1], _good_slot)
    _label(
        project,
        humans[2],
        lambda p: 1 - _good_slot(p) if _question(p) in {(1, 0), (1, 1)} else _good_slot(p),
    )
    # the LLM judge errs on round 1 questions 3, 4, 7 and says tie on round 2 question 5
    llm_mistakes = {(1, 3), (1, 4), (1, 7)}
    _label(
        project,
        _ai_account(project, "ai-llm-hosted"),
        lambda p: (
            "tie"
            if _question(p) == (2, 5)
            else 1 - _good_slot(p)
            if _question(p) in llm_mistakes
            else _good_slot(p)
        ),
    )
    # a reward-model account that always prefers the bad answer
    _label(project, _ai_account(project, "ai-rm-7"), lambda p: 1 - _good_slot(p))

    rows = ai_agreement_by_annotator(project=project, n_boot=200)
    assert [(r["round"], r["username"]) for r in rows] == [
        (1, "ai-llm-hosted"),
        (1, "ai-rm-7"),
        (2, "ai-llm-hosted"),
        (2, "ai-rm-7"),
    ]
    # expected figures, counted here: the human majority is the good answer on every item
    for row in rows:
        items = Item.objects.filter(round=rounds[row["round"]])
        account = get_user_model().objects.get(username=row["username"])
        majority, ai = [], []
        for item in items:
            majority.append("AB"[good_position[item.pk]])
            ai.append(item.judgments.get(annotator=account).choice)
        share = sum(a == m for a, m in zip(ai, majority, strict=True)) / len(ai)
        assert row["agreement"]["estimate"] == pytest.approx(share)
        assert row["agreement"]["low"] <= share <= row["agreement"]["high"]
        assert row["kappa"] == pytest.approx(cohen_kappa_score(ai, majority))
        assert row["n_items"] == row["n_decided"] == ROUND_SIZES[row["round"]]
        assert row["description"] == JUDGE
    assert rows[0]["agreement"]["estimate"] == pytest.approx(7 / 10)
    assert rows[1]["agreement"]["estimate"] == 0.0
    assert rows[2]["agreement"]["estimate"] == pytest.approx(5 / 6)

    # the panel shows the same rows; the CSV download is the panel's table
    researcher = make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    panel = ai_agreement_panel(ProjectData(project), n_boot=200)
    assert [r[:4] for r in panel.rows] == [
        [r["round"], r["username"], JUDGE, r["agreement"]["estimate"]] for r in rows
    ]
    client.force_login(researcher)
    url = reverse("dashboard:project", args=[project.pk])
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "AI annotators against the humans" in html
    assert "judge-&lt;b&gt;model&lt;/b&gt;" in html and "<b>model</b>" not in html
    download = client.get(url, {"format": "csv", "chart": "ai-agreement"})
    assert download.status_code == 200
    table = list(csv.reader(io.StringIO(download.content.decode())))
    assert table[0][:4] == ["round", "annotator", "judge", "agreement"]
    assert [(row[0], row[1]) for row in table[1:]] == [
        (str(r["round"]), r["username"]) for r in rows
    ]
    assert float(table[1][3]) == pytest.approx(0.7, abs=1e-3)

    # the round filter keeps one round
    by_round = client.get(url, {"round": 2, "format": "csv", "chart": "ai-agreement"})
    assert {row[0] for row in csv.reader(io.StringIO(by_round.content.decode()))} == {
        "round",
        "2",
    }


def test_no_ai_labels_says_so(client):
    project, _, _ = _world()
    human = make_user()
    add_member(project, human)
    _label(project, human, _good_slot)
    assert ai_agreement_by_annotator(project=project) == []
    panel = ai_agreement_panel(ProjectData(project))
    assert panel.status == "empty" and "No AI annotator" in panel.message
