"""Which judgments count: the one home of the filters every reader of labels applies.

A judgment is *primary* when it is an annotator's first label on an ordinary item: neither a
planned repeat (the same annotator again, kept for self-agreement) nor a label on a gold item
(kept for gold accuracy). It is *unflagged* when quality control left no mark on it. Label
sources (human, ai, simulated, imported) are named, never mixed in silently. Exports, quality
control, agreement, the dashboard and the loop's mining build on these names; rows already
loaded as dicts are judged by `is_counted_row`, which reads the same field table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q

if TYPE_CHECKING:
    from annotation.exports import ExportPolicy

HUMAN = "human"  # LabelSource.HUMAN; models import this module, so not from there
EVAL_PURPOSE = "eval"  # Round.Purpose.EVAL, for the same reason

# field -> the value a primary judgment has there
PRIMARY_FIELDS: dict[str, Any] = {"is_repeat": False, "is_gold": False, "item__is_gold": False}
# field -> the value an unflagged judgment has there
UNFLAGGED_FIELDS: dict[str, Any] = {"qc_flag": ""}


class JudgmentQuerySet(models.QuerySet):
    """Judgments with named filters for the labels that count."""

    def without_repeats(self) -> JudgmentQuerySet:
        """Leave out planned repeats (an annotator's second label on an item)."""
        return self.filter(is_repeat=False)

    def without_gold(self) -> JudgmentQuerySet:
        """Leave out labels on gold items and labels given as gold checks."""
        return self.filter(is_gold=False, item__is_gold=False)

    def primary(self) -> JudgmentQuerySet:
        """Keep first labels on ordinary items: no repeats, no gold."""
        return self.filter(**PRIMARY_FIELDS)

    def unflagged(self) -> JudgmentQuerySet:
        """Leave out labels quality control flagged."""
        return self.filter(**UNFLAGGED_FIELDS)

    def flagged(self) -> JudgmentQuerySet:
        """Keep only labels quality control flagged."""
        return self.filter(flagged_q())

    def of_sources(self, *sources: str) -> JudgmentQuerySet:
        """Keep labels from the named sources only."""
        return self.filter(source__in=_flat(sources))

    def in_rounds(self, numbers: Iterable[int] | None) -> JudgmentQuerySet:
        """Keep labels on items of the rounds with these numbers (None: every round)."""
        return self if numbers is None else self.filter(item__round__number__in=list(numbers))

    def counted(self, sources: Iterable[str] = (HUMAN,)) -> JudgmentQuerySet:
        """Keep the votes that decide an item: primary, unflagged, of these sources."""
        return self.primary().unflagged().of_sources(sources)

    def for_policy(self, policy: ExportPolicy) -> JudgmentQuerySet:
        """Keep the labels an export policy takes: rounds, sources, gold/repeat/flag rules.

        Labels of human evaluation rounds (Round.Purpose.EVAL) are never exported for training.
        """
        return (
            self.in_rounds(policy.rounds)
            .filter(policy_q(policy))
            .exclude(item__round__purpose=EVAL_PURPOSE)
        )


def flagged_q() -> Q:
    """Return the condition on a judgment that quality control flagged it (for aggregates)."""
    return ~Q(**UNFLAGGED_FIELDS)


def policy_q(policy: ExportPolicy) -> Q:
    """Return the condition on a judgment of an export policy's label filters (rounds aside)."""
    q = Q(source__in=list(policy.sources))
    if not policy.include_gold:
        q &= Q(is_gold=False, item__is_gold=False)
    if not policy.include_repeats:
        q &= Q(is_repeat=False)
    if not policy.include_qc_flagged:
        q &= Q(**UNFLAGGED_FIELDS)
    return q


def is_counted_row(row: Mapping[str, Any], sources: Iterable[str] = (HUMAN,)) -> bool:
    """Return whether a loaded judgment row (a `values()` dict) passes `counted`.

    A field the row was loaded without is not checked: callers load what they need.
    """
    if row["source"] not in _flat(sources):
        return False
    required = {**PRIMARY_FIELDS, **UNFLAGGED_FIELDS}
    return all(row.get(name, value) == value for name, value in required.items())


def _flat(sources: Iterable) -> list[str]:
    """Accept sources given one by one or as one list or tuple."""
    out: list[str] = []
    for source in sources:
        out.extend([source] if isinstance(source, str) else list(source))
    return out
