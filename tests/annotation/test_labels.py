"""Decoding judgments: labels, the pairwise outcomes of a ranking, shown and canonical terms."""

from hypothesis import given
from hypothesis import strategies as st

from annotation import labels


@st.composite
def ranked(draw, min_k: int = 2, max_k: int = 6):
    """Return (dense ranks with possible ties, a display order) of one K-way judgment."""
    k = draw(st.integers(min_k, max_k))
    raw = draw(st.lists(st.integers(1, k), min_size=k, max_size=k))
    dense = {value: n + 1 for n, value in enumerate(sorted(set(raw)))}
    order = draw(st.permutations(range(k)))
    return [dense[value] for value in raw], list(order)


@given(ranked())
def test_shown_and_canonical_ranks_map_back_and_forth(case):
    ranks, order = case
    shown = labels.ranking_to_shown(ranks, order)
    assert labels.ranking_to_canonical(shown, order) == ranks
    # slot s shows position order[s], which keeps its rank
    assert all(shown[s] == ranks[order[s]] for s in range(len(order)))


def test_a_press_on_the_left_is_the_answer_shown_there():
    assert labels.choice_to_canonical("A", [0, 1]) == "A"
    assert labels.choice_to_canonical("A", [1, 0]) == "B"
    assert labels.choice_to_canonical("B", [1, 0]) == "A"
    assert labels.choice_to_canonical("tie", [1, 0]) == "tie"
    assert labels.choice_to_canonical("both_bad", [1, 0]) == "both_bad"


@given(ranked(max_k=2, min_k=2))
def test_a_two_way_ranking_says_what_the_matching_press_says(case):
    ranks, order = case
    shown_ranks = labels.ranking_to_shown(ranks, order)
    press = labels.pair_outcome(shown_ranks, 0, 1)
    assert labels.choice_to_canonical(press, order) == labels.pair_outcome(ranks, 0, 1)


@given(ranked())
def test_a_ranking_gives_one_outcome_per_pair_of_positions(case):
    ranks, _ = case
    outcomes = labels.ranking_outcomes(ranks)
    k = len(ranks)
    assert [(i, j) for i, j, _ in outcomes] == [(i, j) for i in range(k) for j in range(i + 1, k)]
    for i, j, outcome in outcomes:
        expected = "A" if ranks[i] < ranks[j] else "B" if ranks[i] > ranks[j] else "tie"
        assert outcome == expected


@given(ranked())
def test_relabelling_into_another_order_keeps_every_outcome(case):
    ranks, perm = case
    moved = labels.relabel(list(ranks), perm)
    for i, j, outcome in labels.ranking_outcomes(ranks):
        a, b = perm[i], perm[j]
        moved_outcome = labels.pair_outcome(moved, a, b)
        assert moved_outcome == outcome


def test_pairwise_relabel_swaps_sides_only_when_the_answers_swap():
    assert labels.relabel("A", [1, 0]) == "B"
    assert labels.relabel("B", [0, 1]) == "B"
    assert labels.relabel("tie", [1, 0]) == "tie"


def test_labels_top_positions_and_sides():
    assert labels.label_of("A", None) == "A"
    assert labels.label_of("", [2, 1, 2]) == (2, 1, 2)
    assert labels.label_text((2, 1, 2)) == "2,1,2"
    assert labels.top_positions((2, 1, 2)) == "1"
    assert labels.top_positions((1, 2, 1)) == "0+2"
    assert [labels.shown_side(s) for s in ("A", "B", "tie", "1,2,3", "2,1", "1,1,2")] == [
        "left",
        "right",
        None,
        "left",
        "right",
        None,
    ]
