"""Turn the votes on one item into decisions: aggregation, ties, agreement, trust weights."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from annotation import labels
from annotation.exports.policy import CHUNK, UNTRUSTED_WEIGHT, ExportPolicy
from annotation.exports.select import Unit, Vote
from annotation.models import (
    Judgment,
    Project,
)
from evaluation.stats import aggregation


@dataclass
class Decision:
    """What one aggregated (or single) label says about two answers of a unit."""

    first: int  # answer index of the preferred answer (or of A for ties / both-bad)
    second: int
    label: str  # "win" | "tie" | "both_bad"
    soft_label: float | None
    margin: float
    group_id: str


def votes_by_pair(unit: Unit) -> dict[tuple[int, int], list[tuple[Vote, str]]]:
    """Return {(i, j): [(vote, "A"/"B"/"tie"/"both_bad")]} for each compared answer pair."""
    k = len(unit.answers)
    out: dict[tuple[int, int], list] = defaultdict(list)
    for vote in unit.votes:
        if isinstance(vote.label, list):
            if len(vote.label) != k:
                continue
            for i, j, outcome in labels.ranking_outcomes(vote.label):
                out[(i, j)].append((vote, outcome))
        elif k == 2:
            out[(0, 1)].append((vote, vote.label))
    return out


def _to_decision(
    label: str, i: int, j: int, soft_a: float | None, margin: float, gid: str
) -> Decision:
    if label == "A":
        return Decision(i, j, "win", 1.0 if soft_a is None else soft_a, margin, gid)
    if label == "B":
        return Decision(j, i, "win", 1.0 if soft_a is None else 1.0 - soft_a, margin, gid)
    if label == "tie":
        return Decision(i, j, "tie", 0.5 if soft_a is None else soft_a, 0.0, gid)
    return Decision(i, j, "both_bad", None, 0.0, gid)


class Decider:
    """Turn a unit's votes into decisions under the aggregation policy; count drops."""

    def __init__(self, policy: ExportPolicy, weights: dict | None = None, ds_labels=None):
        self.policy = policy
        self.weights = weights or {}
        self.ds_labels = ds_labels or {}
        self.dropped: Counter = Counter()
        self._majority: dict[tuple, aggregation.AggregatedLabel] = {}

    def majority(self, votes: list[tuple[Vote, str]]) -> aggregation.AggregatedLabel:
        """Return `aggregation.majority_vote` of the votes, memoised on the label multiset.

        An unweighted vote depends only on how many votes each label got, and a few labels
        over a few annotators make few distinct multisets: most decisions hit the cache.
        """
        key = tuple(sorted(lab for _, lab in votes))
        result = self._majority.get(key)
        if result is None:
            result = aggregation.majority_vote([(0, n, lab) for n, lab in enumerate(key)])[0]
            self._majority[key] = result
        return result

    def margin_of(self, votes: list[tuple[Vote, str]], label: str) -> float:
        values = [
            float(self.policy.margins.get(v.strength, 0.0)) for v, lab in votes if lab == label
        ]
        return sum(values) / len(values) if values else 0.0

    def decide(self, unit: Unit) -> list[Decision]:
        policy = self.policy
        out: list[Decision] = []
        ranking = len(unit.answers) > 2
        ordinals = {v.judgment_id: n for n, v in enumerate(unit.votes)} if ranking else {}
        decision_votes = votes_by_pair(unit)
        for i, j in sorted(decision_votes) if ranking else decision_votes:
            votes = decision_votes[(i, j)]
            if len(votes) < policy.min_votes and not unit.adjudicated:
                self.dropped["few_votes"] += 1
                continue
            if policy.aggregation == "per_judgment":
                agreement = self.majority(votes).confidence if policy.min_agreement else 1.0
                if agreement < policy.min_agreement:
                    self.dropped["low_agreement"] += len(votes)
                    continue
                for vote, lab in votes:
                    gid = f"{unit.gid}/{ordinals[vote.judgment_id]}" if ranking else unit.gid
                    margin = float(policy.margins.get(vote.strength, 0.0))
                    out.append(_to_decision(lab, i, j, None, margin, gid))
                continue
            if policy.aggregation == "majority":
                result = self.majority(votes)
            elif policy.aggregation == "trust_weighted":
                tuples = [((i, j), v.rater, lab) for v, lab in votes]  # one decision at a time
                result = aggregation.weighted_vote(
                    tuples, self.weights, default_weight=UNTRUSTED_WEIGHT
                )[(i, j)]
            else:
                result = self.ds_labels[(unit.gid, i, j)]
            if result.confidence < policy.min_agreement:
                self.dropped["low_agreement"] += 1
                continue
            label = "tie" if result.split else result.label
            if result.split:
                self.dropped["split_counted_as_tie"] += 1
            margin = self.margin_of(votes, label)
            out.append(_to_decision(label, i, j, result.soft_label, margin, unit.gid))
        return out


def gold_weights(project: Project) -> dict[tuple, float]:
    """Return each rater's trust: Laplace-smoothed gold accuracy (`labels.gold_tallies`)."""
    rows = (
        Judgment.objects.filter(project=project, item__is_gold=True)
        .exclude(item__gold_answer__isnull=True)
        .values_list(
            "annotator_id", "external_rater", "choice", "ranking", "item__gold_answer", "is_repeat"
        )
        .iterator(chunk_size=CHUNK)
    )
    tallies = labels.gold_tallies(
        (
            ("u", annotator_id) if annotator_id is not None else ("x", external),
            labels.label_of(choice, ranking),
            gold,
            is_repeat,
        )
        for annotator_id, external, choice, ranking, gold, is_repeat in rows
    )
    # (correct + 1) / (answered + 2): Laplace's rule of succession
    return {rater: (right + 1) / (answered + 2) for rater, (right, answered) in tallies.items()}
