"""The dashboard's battle counts come from SQL groups and equal the per-battle path exactly.

A project mixes what the counted rule (`Judgment.objects.counted()`) keeps and drops: human
and AI labels, repeats, gold, QC flags, ties, both-bad, K-way rankings with tied ranks, items
whose two lowest positions are not 0 and 1, one model at both positions, and candidates named
by version, by model name, by checkpoint only or not at all.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from django.db import connection

from annotation.imports import content_hash
from annotation.models import Candidate, Item, ItemCandidate, Judgment, Prompt, Round
from config.console.dashboard import data as loading
from config.console.dashboard.tabs import models as models_tab
from evaluation.stats import leaderboard
from tests.factories import make_project, make_user
from training.models import ModelVersion

pytestmark = pytest.mark.django_db

CHOICES = ["A", "B", "tie", "both_bad"]


def _item(project, round_, names, *, positions=None, gold=False):
    """Create an item whose candidates carry (version, model name, checkpoint) at positions."""
    prompt_text = f"prompt {Prompt.objects.count()}"
    prompt = Prompt.objects.create(
        project=project, text=prompt_text, content_hash=content_hash(prompt_text)
    )
    item = Item.objects.create(
        project=project,
        round=round_,
        prompt=prompt,
        is_gold=gold,
        gold_answer="A" if gold else None,
    )
    for index, (version, model_name, checkpoint) in enumerate(names):
        text = f"answer {index} " * (index + 1) + prompt_text
        candidate = Candidate.objects.create(
            prompt=prompt,
            text=text,
            content_hash=content_hash(text),
            model_name=model_name,
            checkpoint_id=checkpoint,
            policy_version=version,
        )
        position = positions[index] if positions else index
        ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
    return item


def _mixed_project(*, rankings: bool = True):
    """Build a project with every kind of judgment the counted rule keeps or drops."""
    project = make_project(overlap=3)
    rounds = [Round.objects.create(project=project, number=n) for n in (1, 2)]
    annotator = make_user()
    v1, v2 = (ModelVersion.objects.create(name=f"v{n}", artifact_path="/x") for n in (1, 2))
    models = [
        (v1, "ignored-name", "c1"),  # the version's name wins
        (v2, "", ""),
        (None, "plain", "c3"),
        (None, "", "ckpt-only"),
        (None, "", ""),  # "unnamed model"
    ]
    rng = random.Random(7)
    for n in range(120):
        round_ = rounds[n % 2]
        shape = n % 6
        if shape == 0:  # two lowest positions are 2 and 5, a third answer at 9
            names = rng.sample(models, 3)
            item = _item(project, round_, names, positions=[5, 2, 9])
        elif shape == 1:  # the same model twice: no battle
            item = _item(project, round_, [models[0], (v1, "other", "c9")])
        elif shape == 2 and rankings:  # K = 3 ranking
            item = _item(project, round_, rng.sample(models, 3))
        elif shape == 3:
            item = _item(project, round_, rng.sample(models, 2), gold=rng.random() < 0.2)
        else:
            item = _item(project, round_, rng.sample(models, 2))
        for _ in range(rng.randint(1, 3)):
            fields = {
                "source": rng.choice(["human", "human", "human", "ai"]),
                "is_repeat": rng.random() < 0.15,
                "is_gold": rng.random() < 0.1,
                "qc_flag": rng.choice(["", "", "", "", "too_fast"]),
            }
            if shape == 2 and rankings:
                ranking = [rng.randint(1, 3) for _ in range(3)]  # ties allowed
                Judgment.objects.create(
                    project=project, item=item, annotator=annotator, ranking=ranking, **fields
                )
            else:
                Judgment.objects.create(
                    project=project,
                    item=item,
                    annotator=annotator,
                    choice=rng.choice(CHOICES),
                    **fields,
                )
    return project, rounds


def _per_battle(data):
    """Return the per-battle tuples of the Python path."""
    return [(b.model_a, b.model_b, b.outcome) for b in data.battles]


def _assert_same_counts(sql: leaderboard.PairCounts, per_battle: leaderboard.PairCounts):
    assert sql.models == per_battle.models
    np.testing.assert_array_equal(sql.first, per_battle.first)
    np.testing.assert_array_equal(sql.second, per_battle.second)
    np.testing.assert_array_equal(sql.outcomes(), per_battle.outcomes())


def test_sql_counts_equal_the_per_battle_counts_for_mixed_judgments():
    project, rounds = _mixed_project()
    for round_ in (None, *rounds):
        data = loading.ProjectData(project, round_=round_)
        battles = _per_battle(data)
        # The mix gives battles of every outcome, from choices and from rankings.
        assert {outcome for _, _, outcome in battles} == set(CHOICES)
        _assert_same_counts(data.battle_counts, leaderboard.pair_counts(battles))
    data = loading.ProjectData(project)
    assert {"v1", "v2", "plain", "ckpt-only", "unnamed model"} == set(data.battle_counts.models)
    assert "ignored-name" not in data.battle_counts.models


def test_sql_counts_equal_hand_counts_of_counted_pairwise_votes():
    project, _ = _mixed_project(rankings=False)
    counted = Judgment.objects.filter(project=project).counted().exclude(choice="")
    expected: dict[tuple[str, str], list[int]] = {}
    for judgment in counted.select_related("item"):
        slots = sorted(
            judgment.item.slots.select_related("candidate__policy_version"),
            key=lambda s: s.position,
        )
        a, b = (
            loading.model_key(
                s.candidate.model_name,
                s.candidate.checkpoint_id,
                getattr(s.candidate.policy_version, "name", None),
            )
            for s in slots[:2]
        )
        if a == b:
            continue
        pair = tuple(sorted((a, b)))
        outcome = {"A": 0, "B": 1, "tie": 2, "both_bad": 3}[judgment.choice]
        if (a, b) != pair and outcome < 2:
            outcome = 1 - outcome
        expected.setdefault(pair, [0, 0, 0, 0])[outcome] += 1
    counts = loading.ProjectData(project).battle_counts
    got = {}
    for p in range(len(counts.first)):
        first, second = counts.models[counts.first[p]], counts.models[counts.second[p]]
        row = [int(x) for x in counts.outcomes()[p]]
        if (first, second) != tuple(sorted((first, second))):
            first, second, row = second, first, [row[1], row[0], row[2], row[3]]
        if any(row):
            got[(first, second)] = row
    assert got == expected
    assert sum(map(sum, expected.values())) > 50  # the rule left enough votes to compare


def test_leaderboard_panel_equals_the_per_battle_leaderboard():
    project, _ = _mixed_project()
    data = loading.ProjectData(project)
    panel = models_tab.leaderboard_panel(data)
    board = leaderboard.leaderboard(
        _per_battle(data), n_boot=models_tab.LEADERBOARD_BOOT, seed=0, ties="half"
    )
    expected = [
        [
            r.rank,
            str(r.model),
            r.rating,
            r.ci_low,
            r.ci_high,
            r.n_battles,
            r.wins,
            r.losses,
            r.ties,
            r.both_bad,
        ]
        for r in board.rows
    ]
    assert panel.rows == expected  # ratings, intervals and ranks identical, not just close


def test_the_judgment_cap_applies_to_sql_counts_as_to_battles(monkeypatch):
    project, _ = _mixed_project()
    monkeypatch.setattr(loading, "MAX_JUDGMENTS", 40)
    data = loading.ProjectData(project)
    assert data.judgments_capped
    _assert_same_counts(data.battle_counts, leaderboard.pair_counts(_per_battle(data)))


class _RowCounter:
    """Count the queries and the rows the database returned to Python."""

    def __init__(self):
        self.queries = 0
        self.rows = 0

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        self.queries += 1
        self.rows += max(context["cursor"].rowcount, 0)
        return result


def _pairwise_project(n_judgments: int):
    project = make_project(overlap=1)
    round_ = Round.objects.create(project=project, number=1)
    annotator = make_user()
    models = [(None, f"m{i}", "") for i in range(3)]
    items = [_item(project, round_, [models[i % 3], models[(i + 1) % 3]]) for i in range(6)]
    Judgment.objects.bulk_create(
        Judgment(project=project, item=items[n % 6], annotator=annotator, choice=CHOICES[n % 4])
        for n in range(n_judgments)
    )
    return project


@pytest.mark.parametrize("n_judgments", [24, 2_400])
def test_pairwise_counts_fetch_rows_per_group_not_per_judgment(
    n_judgments, django_assert_max_num_queries
):
    project = _pairwise_project(n_judgments)
    counter = _RowCounter()
    with django_assert_max_num_queries(3), connection.execute_wrapper(counter):
        counts = loading.ProjectData(project).battle_counts
    assert counts.n_battles == n_judgments
    # 3 model pairs x 4 outcomes (each item's pair always at the same positions): 12 groups
    # from the GROUP BY, nothing from the (empty) ranking queries, whatever the judgments.
    assert counter.rows == 12
