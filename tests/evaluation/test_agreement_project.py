"""Project agreement from the database equals the pure library on the same label matrix."""

import random

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from annotation.labels import PAIRWISE_LABELS
from annotation.models import Judgment, LabelSource, Membership, TaskKind
from evaluation import selectors
from evaluation.stats.agreement import (
    cohen_kappa,
    fleiss_kappa,
    krippendorff_alpha,
    mean_pairwise_kendall_tau,
    percent_agreement,
    rating_counts,
)
from tests.factories import add_member, make_items, make_project, make_round, make_user

pytestmark = pytest.mark.django_db

# 3 annotators x 10 items; None = not labelled.
MATRIX = [
    ["A", "A", "B", "B", "tie", "A", "B", "A", "both_bad", "A"],
    ["A", "B", "B", "B", "tie", "A", "A", "A", "both_bad", None],
    ["A", "A", "B", "A", "B", "A", "B", None, "tie", "A"],
]


def _label(project, users, items, matrix, *, source=LabelSource.HUMAN):
    for user, row in zip(users, matrix, strict=True):
        for item, label in zip(items, row, strict=True):
            if label is None:
                continue
            fields = {"ranking": label} if isinstance(label, list) else {"choice": label}
            Judgment.objects.create(
                project=project, item=item, annotator=user, source=source, **fields
            )


@pytest.fixture
def pairwise():
    project = make_project(overlap=3)
    users = [make_user(f"ann{i}") for i in range(3)]
    for user in users:
        add_member(project, user)
    items = make_items(project, 10)
    _label(project, users, items, MATRIX)
    return project, users, items


def test_alpha_percent_agreement_and_fleiss_equal_the_library_on_the_same_matrix(pairwise):
    project, _, _ = pairwise

    report = selectors.project_agreement(project=project, n_boot=200, seed=1)

    human = report["by_source"]["human"]
    assert report["sources"] == ["human"]
    assert human["n_items"] == 10 and human["n_judgments"] == 28 and human["n_annotators"] == 3
    assert human["alpha"]["estimate"] == pytest.approx(krippendorff_alpha(MATRIX, "nominal"))
    assert human["percent_agreement"]["estimate"] == pytest.approx(percent_agreement(MATRIX))
    # Fleiss over the 8 items that all three annotators labelled.
    full = [[row[i] for row in MATRIX] for i in range(10) if all(row[i] for row in MATRIX)]
    _, counts = rating_counts(np.array(full, dtype=object).T, categories=PAIRWISE_LABELS)
    assert human["fleiss_kappa"]["n_items"] == 8
    assert human["fleiss_kappa"]["estimate"] == pytest.approx(fleiss_kappa(counts))
    for figure in (human["alpha"], human["fleiss_kappa"]):
        assert figure["low"] <= figure["estimate"] <= figure["high"]
        assert figure["n_valid"] > 150


def test_cohen_kappa_matrix_covers_pairs_with_enough_shared_items(pairwise):
    project, users, _ = pairwise

    report = selectors.project_agreement(project=project, n_boot=200, min_shared_items=9)

    table = report["by_source"]["human"]["pairwise"]
    assert table["metric"] == "cohen_kappa"
    assert [a["name"] for a in table["annotators"]] == ["ann0", "ann1", "ann2"]
    assert table["n_shared"] == [[10, 9, 9], [9, 9, 8], [9, 8, 9]]
    # ann1 and ann2 share only 8 items: below the minimum of 9, no kappa.
    assert table["matrix"][1][2] is None and table["matrix"][2][1] is None
    shared = [i for i in range(10) if MATRIX[0][i] and MATRIX[1][i]]
    expected = cohen_kappa([MATRIX[0][i] for i in shared], [MATRIX[1][i] for i in shared])
    assert table["matrix"][0][1] == pytest.approx(expected)
    assert table["matrix"][1][0] == table["matrix"][0][1]
    pair = next(p for p in table["pairs"] if {p["a"], p["b"]} == {users[0].pk, users[1].pk})
    assert pair["n_shared"] == 9
    assert pair["low"] <= pair["estimate"] <= pair["high"]


def test_leave_one_out_agreement_is_the_share_of_labels_matching_the_others_mode(pairwise):
    project, _, _ = pairwise

    rows = selectors.project_agreement(project=project, n_boot=100)["by_source"]["human"][
        "leave_one_out"
    ]

    def expected(rater: int) -> float:
        credits = []
        for i in range(10):
            mine = MATRIX[rater][i]
            others = [MATRIX[r][i] for r in range(3) if r != rater and MATRIX[r][i]]
            if mine is None or not others:
                continue
            counts = {label: others.count(label) for label in others}
            modes = [label for label, n in counts.items() if n == max(counts.values())]
            credits.append(1 / len(modes) if mine in modes else 0.0)
        return sum(credits) / len(credits)

    by_name = {row["name"]: row for row in rows}
    for rater in range(3):
        assert by_name[f"ann{rater}"]["agreement"]["estimate"] == pytest.approx(expected(rater))
    assert by_name["ann0"]["n_items"] == 10


def test_sources_are_reported_apart_and_ai_is_compared_with_humans_per_round(pairwise):
    project, _users, items = pairwise
    judge = make_user("ai-judge")
    add_member(project, judge)
    ai_labels = ["A", "A", "B", "B", "tie", "B", "B", "A", "both_bad", "A"]
    _label(project, [judge], items, [ai_labels], source=LabelSource.AI)

    report = selectors.project_agreement(project=project, n_boot=100)

    assert report["sources"] == ["human", "ai"]
    # The human figures are unchanged by the AI labels.
    assert report["by_source"]["human"]["alpha"]["estimate"] == pytest.approx(
        krippendorff_alpha(MATRIX, "nominal")
    )
    assert report["by_source"]["ai"]["n_items"] == 0  # one AI label per item: no overlap
    (cross,) = report["cross_source"]
    assert cross["round"] == 1 and cross["source"] == "ai" and cross["reference"] == "human"
    assert cross["n_items"] == 10
    # Human modes per item: A A B B tie A B A both_bad A; the AI differs on item 5 only.
    assert cross["agreement"]["estimate"] == pytest.approx(0.9)
    assert cross["kappa"] is not None and cross["kappa"] > 0.8


def test_flagged_repeat_and_gold_labels_are_left_out_unless_asked(pairwise):
    project, users, _items = pairwise
    Judgment.objects.filter(annotator=users[2]).update(qc_flag="paused:position_bias")
    (gold_item,) = make_items(project, 1, gold=["A"])
    Judgment.objects.create(project=project, item=gold_item, annotator=users[0], choice="B")
    Judgment.objects.create(project=project, item=gold_item, annotator=users[1], choice="A")

    clean = selectors.project_agreement(project=project, n_boot=50)["by_source"]["human"]
    everything = selectors.project_agreement(
        project=project, n_boot=50, include_flagged=True, include_gold=True
    )["by_source"]["human"]

    assert clean["n_judgments"] == 19 and clean["n_annotators"] == 2
    assert clean["alpha"]["estimate"] == pytest.approx(krippendorff_alpha(MATRIX[:2], "nominal"))
    assert everything["n_judgments"] == 30


def test_one_round_only(pairwise):
    project, users, _ = pairwise
    round_2 = make_round(project)
    later = make_items(project, 4, round_=round_2)
    _label(project, users, later, [["A"] * 4, ["A"] * 4, ["B"] * 4])

    report = selectors.project_agreement(project=project, round_=round_2, n_boot=50)

    assert report["round"] == 2
    assert report["by_source"]["human"]["n_items"] == 4
    assert report["by_source"]["human"]["alpha"]["estimate"] == pytest.approx(
        krippendorff_alpha([["A"] * 4, ["A"] * 4, ["B"] * 4], "nominal")
    )


def test_ranking_project_uses_ordinal_alpha_over_positions_and_kendall_tau():
    project = make_project(task_kind=TaskKind.RANKING, k=3, overlap=3)
    users = [make_user() for _ in range(3)]
    items = make_items(project, 6)
    rng = random.Random(3)
    rankings = [[rng.sample([1, 2, 3], 3) for _ in items] for _ in users]
    rankings[2][5] = None
    _label(project, users, items, rankings)

    report = selectors.project_agreement(project=project, n_boot=100, min_shared_items=5)

    block = report["by_source"]["human"]
    # Units are item x position: the rank each annotator gave each candidate.
    units = [
        [None if r[i] is None else r[i][p] for i in range(6) for p in range(3)] for r in rankings
    ]
    assert block["level"] == "ordinal"
    assert block["alpha"]["estimate"] == pytest.approx(krippendorff_alpha(units, "ordinal"))
    per_item = [[r[i] for r in rankings] for i in range(6)]
    assert block["kendall_tau"]["estimate"] == pytest.approx(mean_pairwise_kendall_tau(per_item))
    assert block["fleiss_kappa"] is None
    assert block["pairwise"]["metric"] == "kendall_tau_b"
    assert len(block["leave_one_out"]) == 3


def test_label_distribution_counts_labels_and_left_presses_per_source(pairwise):
    project, users, _items = pairwise
    Judgment.objects.filter(annotator=users[0]).update(shown_choice="A")
    Judgment.objects.filter(annotator=users[1], choice__in=["A", "B"]).update(shown_choice="B")

    result = selectors.label_distribution(project=project)

    human = result["by_source"]["human"]
    flat = [label for row in MATRIX for label in row if label]
    assert human["n"] == 28
    assert human["counts"] == {label: flat.count(label) for label in PAIRWISE_LABELS}
    assert human["left"] == 10 and human["right"] == 7


def test_agreement_and_quality_table_take_a_bounded_number_of_queries(pairwise):
    project, _users, _ = pairwise
    for i in range(20):
        add_member(project, make_user(f"extra{i}"), Membership.Role.ANNOTATOR)

    with CaptureQueriesContext(connection) as queries:
        selectors.project_agreement(project=project, n_boot=20)
    assert len(queries) <= 3
    with CaptureQueriesContext(connection) as queries:
        table = selectors.annotator_quality_table(project=project)
    assert len(queries) <= 8
    assert len(table) == 23
