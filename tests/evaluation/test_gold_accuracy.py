"""Gold accuracy has one rule: QC's figure and the exports' trust weights count alike."""

import random

import pytest
from django.utils import timezone

from annotation.exports import gold_weights
from annotation.labels import gold_tallies
from annotation.models import Assignment, Judgment, LabelSource, TaskKind
from evaluation import selectors
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _judge(project, user, item, label, *, repeat_of=None, source=LabelSource.HUMAN, flag=""):
    """Record a submitted judgment (canonical label) as the serving path stores it."""
    assignment = Assignment.objects.create(
        project=project,
        item=item,
        annotator=user,
        kind=Assignment.Kind.REPEAT if repeat_of else Assignment.Kind.GOLD,
        repeat_of=repeat_of,
        display_order=list(range(project.k)),
        status=Assignment.Status.SUBMITTED,
        lease_expires=timezone.now(),
    )
    fields = {"ranking": label} if isinstance(label, list) else {"choice": label}
    Judgment.objects.create(
        project=project,
        item=item,
        assignment=assignment,
        annotator=user,
        source=source,
        is_gold=item.is_gold,
        is_repeat=repeat_of is not None,
        qc_flag=flag,
        **fields,
    )
    return assignment


def _qc_and_trust(project, user):
    gold = selectors.annotator_quality(project=project, annotator_ids=[user.pk])[user.pk].gold
    trust = selectors.annotator_trust_weights(project=project)[user.pk]
    return gold, trust


def test_a_ranking_with_the_gold_best_answer_is_right_for_qc_and_for_trust():
    # Given a ranker who finds the gold best answer but orders the rest differently
    project = make_project(task_kind=TaskKind.RANKING, k=3)
    user = make_user("ranker")
    add_member(project, user)
    right, wrong = make_items(project, 2, gold=[[1, 2, 3], [2, 1, 3]])
    _judge(project, user, right, [1, 3, 2])
    _judge(project, user, wrong, [1, 2, 3])

    gold, trust = _qc_and_trust(project, user)

    # Then both count one right answer of two: (1 + 1) / (2 + 2)
    assert (gold.n_correct, gold.n_items) == (1, 2)
    assert trust == pytest.approx(0.5)


def test_a_planned_repeat_of_a_gold_item_counts_neither_for_qc_nor_for_trust():
    # Given an annotator right on a gold item, and wrong when it comes back as a repeat
    project = make_project()
    user = make_user("repeater")
    add_member(project, user)
    (item,) = make_items(project, 1, gold=["A"])
    first = _judge(project, user, item, "A")
    _judge(project, user, item, "B", repeat_of=first)

    gold, trust = _qc_and_trust(project, user)

    assert (gold.n_correct, gold.n_items) == (1, 1)
    assert trust == pytest.approx(2 / 3)


def test_qc_gold_accuracy_and_trust_weight_agree_for_every_annotator():
    # Given annotators of several sources answering gold items, with repeats and flagged labels
    rng = random.Random(7)
    project = make_project(task_kind=TaskKind.RANKING, k=3)
    answers = [rng.sample([1, 2, 3], 3) for _ in range(12)]
    items = make_items(project, 12, gold=answers)
    users = []
    for n, source in enumerate([LabelSource.HUMAN] * 3 + [LabelSource.AI]):
        user = make_user(f"rater{n}")
        add_member(project, user)
        users.append(user)
        for item in items:
            label = rng.choice([item.gold_answer, rng.sample([1, 2, 3], 3)])
            flag = "paused:speed" if rng.random() < 0.2 else ""
            assignment = _judge(project, user, item, label, source=source, flag=flag)
            if rng.random() < 0.3:
                _judge(project, user, item, rng.sample([1, 2, 3], 3), repeat_of=assignment)

    # Then each annotator's trust weight is the Laplace-smoothed form of their QC figure
    for user in users:
        gold, trust = _qc_and_trust(project, user)
        assert gold.n_items == 12
        assert trust == pytest.approx((gold.n_correct + 1) / (gold.n_items + 2))
    assert set(gold_weights(project)) == {("u", user.pk) for user in users}


def test_gold_tallies_skip_repeats_and_labels_without_a_gold_answer():
    rows = [
        ("a", "A", "A", False),
        ("a", "B", "A", True),  # a repeat: not counted
        ("a", "A", None, False),  # not a gold item
        ("b", (2, 1, 1), [3, 1, 2], False),  # best answers 1+2 against 1: wrong
        ("b", (1, 2, 2), "A", False),  # a ranking against a choice: wrong
    ]

    assert gold_tallies(rows) == {"a": (1, 1), "b": (0, 2)}
