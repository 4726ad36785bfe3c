"""What a judgment says: its label, the pairwise outcomes of a ranking, shown and canonical terms.

Pure (no Django): every app that reads a judgment decodes it here. Canonical terms: an item's
answers sit at positions 0..K-1; a pairwise ``choice`` is "A" (position 0 better), "B",
"tie" or "both_bad"; a ranking holds ``ranks[i]``, the rank of position i (1 = best, ties
share a rank). Shown terms: an assignment's ``display_order`` maps display slot -> position,
and ``shown_choice`` keeps what the annotator pressed ("A" = the left slot; for a ranking the
ranks by slot, comma-separated).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

PAIRWISE_LABELS = ("A", "B", "tie", "both_bad")

Label = str | tuple[int, ...]  # a pairwise choice, or the ranks by position


def label_of(choice: str, ranking: Sequence[int] | None) -> Label:
    """Return a judgment's canonical label: the choice, or the ranks as a tuple."""
    return choice if choice else tuple(ranking)


def label_text(label: Label) -> str:
    """Return a hashable, comparable text form of a label ("A", or "1,2,3" for ranks)."""
    return label if isinstance(label, str) else ",".join(map(str, label))


def pair_outcome(ranks: Sequence[int], i: int, j: int) -> str:
    """Return what a ranking says of positions i and j: "A" (i better), "B" or "tie"."""
    if ranks[i] < ranks[j]:
        return "A"
    if ranks[i] > ranks[j]:
        return "B"
    return "tie"


def ranking_outcomes(ranks: Sequence[int]) -> list[tuple[int, int, str]]:
    """Return (i, j, outcome) for every pair of positions i < j of a ranking."""
    k = len(ranks)
    return [(i, j, pair_outcome(ranks, i, j)) for i in range(k) for j in range(i + 1, k)]


def top_positions(ranks: Sequence[int]) -> str:
    """Return the best-ranked position(s) of a ranking, e.g. "0" or "0+2" when tied."""
    best = min(ranks)
    return "+".join(str(position) for position, rank in enumerate(ranks) if rank == best)


def gold_key(label: Label, gold: Any) -> tuple[Any, Any]:
    """Return (answer, gold answer) in comparable terms: choices as is, rankings by best answer."""
    if isinstance(label, str):
        return label, gold
    if not isinstance(gold, list):
        return top_positions(label), None
    return top_positions(label), top_positions(tuple(gold))


def gold_tallies(
    labels: Iterable[tuple[Hashable, Label, Any, bool]],
) -> dict[Hashable, tuple[int, int]]:
    """Return rater -> (right, answered) from (rater, label, gold answer, is_repeat) rows.

    The one rule of gold accuracy, for quality control and for the exports' trust weights:
    a rater answers each gold item once, so planned repeats are left out (rows without a gold
    answer are not gold checks); every other label counts whatever its source (a rater is
    judged by their own labels) or QC flag (a flag does not make a wrong answer right). A
    pairwise label is right when it is the gold choice; a ranking when its best-ranked
    answer(s) are the gold ranking's (a gold item asks for the best answer; the order below
    it may fairly differ).
    """
    tallies: dict[Hashable, list[int]] = {}
    for rater, label, gold, is_repeat in labels:
        if is_repeat or gold is None:
            continue
        answer, expected = gold_key(label, gold)
        tally = tallies.setdefault(rater, [0, 0])
        tally[0] += int(expected is not None and answer == expected)
        tally[1] += 1
    return {rater: (right, answered) for rater, (right, answered) in tallies.items()}


def choice_to_canonical(shown: str, display_order: Sequence[int]) -> str:
    """Return the canonical choice of a pressed one: "A"/"B" name display slots."""
    if shown not in ("A", "B"):
        return shown
    position = display_order[0 if shown == "A" else 1]
    return "A" if position == 0 else "B"


def ranking_to_canonical(shown_ranks: Sequence[int], display_order: Sequence[int]) -> list[int]:
    """Return ranks by position from ranks given by display slot."""
    canonical = [0] * len(shown_ranks)
    for slot, rank in enumerate(shown_ranks):
        canonical[display_order[slot]] = rank
    return canonical


def ranking_to_shown(ranks: Sequence[int], display_order: Sequence[int]) -> list[int]:
    """Return ranks by display slot from ranks by position."""
    return [ranks[position] for position in display_order]


def shown_side(shown: str) -> str | None:
    """Return "left"/"right" for an A/B press, or for a ranking whether slot A beat slot B."""
    if shown == "A":
        return "left"
    if shown == "B":
        return "right"
    if "," in shown:
        try:
            first, second = (int(x) for x in shown.split(",")[:2])
        except ValueError:
            return None
        if first != second:
            return "left" if first < second else "right"
    return None


def relabel(label: str | list[int], perm: Sequence[int]) -> str | list[int]:
    """Return a label given in another item's position order in this item's order.

    ``perm[p]`` is this item's position of the other item's position p.
    """
    if isinstance(label, list):
        out = [0] * len(label)
        for position, rank in enumerate(label):
            out[perm[position]] = rank
        return out
    if label in ("A", "B") and perm[0] == 1:
        return "B" if label == "A" else "A"
    return label
