"""Simulated annotators label a project through the real HTTP API."""

import random

import pytest
from django.core.management import call_command

from annotation import services
from annotation.imports import content_hash
from annotation.models import Candidate, Item, ItemCandidate, Judgment, Project, Prompt, Round
from annotation.simulation import PRESETS, Profile, decide, run_pool
from training import demo

pytestmark = pytest.mark.django_db(transaction=True)


def _demo_project(n_items: int, overlap: int = 2) -> Project:
    project = Project.objects.create(name="sim", overlap=overlap)
    round_ = Round.objects.create(project=project, number=1)
    rng = random.Random(0)
    for text in demo.generate_prompts(n_items, seed=1):
        problem = demo.parse_prompt(text)
        prompt = Prompt.objects.create(project=project, text=text, content_hash=content_hash(text))
        item = Item.objects.create(project=project, round=round_, prompt=prompt)
        right = demo.render_response(problem, "polite", problem.answer)
        wrong = demo.render_response(problem, "rude", demo.wrong_answer(problem, rng))
        for pos, answer in enumerate(rng.sample([right, wrong], 2)):
            cand = Candidate.objects.create(
                prompt=prompt, text=answer, content_hash=content_hash(answer)
            )
            ItemCandidate.objects.create(item=item, candidate=cand, position=pos)
    return project


def test_careful_annotators_prefer_the_truly_better_answer_and_bad_actors_do_not(live_server):
    project = _demo_project(30, overlap=3)
    pool = [
        ("careful", PRESETS["careful"]),
        ("always_left", PRESETS["always_left"]),
        ("random", PRESETS["random"]),
    ]
    annotators = [
        (
            f"sim-{kind}",
            services.simulated_annotator_ensure(project=project, username=f"sim-{kind}"),
            profile,
        )
        for kind, profile in pool
    ]
    stats = run_pool(base_url=live_server.url, project_id=project.pk, annotators=annotators)
    assert [s.errors for s in stats] == [[], [], []]
    assert Judgment.objects.count() == 90
    assert set(Judgment.objects.values_list("source", flat=True)) == {"simulated"}

    def accuracy(username: str) -> float:
        right = 0
        rows = Judgment.objects.filter(annotator__username=username).select_related("item")
        for j in rows:
            texts = [s.candidate.text for s in j.item.slots.order_by("position")]
            prompt = j.item.prompt.text
            a_wins = demo.true_reward(prompt, texts[0]) > demo.true_reward(prompt, texts[1])
            better = "A" if a_wins else "B"
            right += j.choice == better
        return right / rows.count()

    assert accuracy("sim-careful") > 0.95
    assert accuracy("sim-always_left") < 0.8
    shown = set(
        Judgment.objects.filter(annotator__username="sim-always_left").values_list(
            "shown_choice", flat=True
        )
    )
    assert shown == {"A"}


def test_ranking_decisions_follow_the_true_score():
    payload = {
        "prompt": {"text": "What is 3 + 4?", "messages": None},
        "candidates": [
            {"slot": "A", "text": "Ugh, obviously 9."},
            {"slot": "B", "text": "Sure! 3 + 4 = 7."},
            {"slot": "C", "text": "The answer is 7."},
        ],
    }
    body = decide(
        payload,
        {"task_kind": "ranking", "choices": []},
        Profile(noise=0.01),
        demo.true_reward,
        random.Random(0),
    )
    assert body == {"ranking": [3, 1, 2]}


def test_simulate_command_reports_each_annotator(live_server, capsys):
    project = _demo_project(6, overlap=2)
    call_command(
        "simulate",
        "--project",
        str(project.pk),
        "--url",
        live_server.url,
        "--pool",
        "careful:1,noisy:1",
    )
    out = capsys.readouterr().out
    assert "sim-careful-0" in out and "submitted=    6" in out
    assert Judgment.objects.count() == 12
