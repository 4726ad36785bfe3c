"""Turn several judgments per item into one training label: majority, weighted, Dawid-Skene.

Input everywhere is a list of ``(item_id, annotator_id, label)`` tuples. Pairwise labels are
``"A"``, ``"B"``, ``"tie"`` and ``"both_bad"``; ties and both-bad stay outcomes of their own,
and every result also carries a soft label, the share preferring A among A/B/tie votes with a
tie counted half. Numpy/scipy only, no Django.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import logsumexp

Judgment = tuple[Hashable, Hashable, Hashable]

A, B, TIE, BOTH_BAD = "A", "B", "tie", "both_bad"


@dataclass(frozen=True)
class AggregatedLabel:
    """One item's aggregated label."""

    label: Hashable
    confidence: float
    soft_label: float | None
    n_votes: int
    split: bool = False
    distribution: dict[Hashable, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DawidSkeneResult:
    """Labels and fitted parameters of a Dawid-Skene model."""

    labels: dict[Hashable, AggregatedLabel]
    classes: list[Hashable]
    class_priors: dict[Hashable, float]
    confusion: dict[Hashable, np.ndarray]
    log_likelihood: float
    n_iter: int
    converged: bool


def soft_label(
    distribution: Mapping[Hashable, float],
    a_label: Hashable = A,
    b_label: Hashable = B,
    tie_label: Hashable = TIE,
) -> float | None:
    """Return (A + tie/2) / (A + B + tie) from label weights, or None without such votes."""
    a = distribution.get(a_label, 0.0)
    b = distribution.get(b_label, 0.0)
    tie = distribution.get(tie_label, 0.0)
    total = a + b + tie
    if total <= 0:
        return None
    return (a + 0.5 * tie) / total


def _group(judgments: Iterable[Judgment]) -> dict[Hashable, list[tuple[Hashable, Hashable]]]:
    """Group (annotator, label) pairs by item, keeping first-seen item order."""
    by_item: dict[Hashable, list[tuple[Hashable, Hashable]]] = defaultdict(list)
    for item, annotator, label in judgments:
        by_item[item].append((annotator, label))
    return by_item


def _decide(
    weights: Mapping[Hashable, float],
    n_votes: int,
    split_label: Hashable,
    a_label: Hashable,
    b_label: Hashable,
    tie_label: Hashable,
) -> AggregatedLabel:
    """Pick the label with the largest weight; an even split at the top yields ``split_label``."""
    total = sum(weights.values())
    if total <= 0:
        shares = dict.fromkeys(weights, 0.0)
        return AggregatedLabel(split_label, 0.0, None, n_votes, True, shares)
    shares = {label: weight / total for label, weight in weights.items()}
    best = max(shares.values())
    leaders = [label for label, share in shares.items() if np.isclose(share, best)]
    split = len(leaders) > 1
    label = split_label if split else leaders[0]
    return AggregatedLabel(
        label=label,
        confidence=best,
        soft_label=soft_label(shares, a_label, b_label, tie_label),
        n_votes=n_votes,
        split=split,
        distribution=shares,
    )


def majority_vote(
    judgments: Iterable[Judgment],
    *,
    split_label: Hashable = TIE,
    a_label: Hashable = A,
    b_label: Hashable = B,
    tie_label: Hashable = TIE,
) -> dict[Hashable, AggregatedLabel]:
    """Return the plurality label per item; an even split at the top becomes ``split_label``.

    An even A/B split means no preference can be claimed, hence the default of ``"tie"``;
    ``split`` is set on such items so callers can drop them instead.
    """
    return weighted_vote(
        judgments,
        {},
        default_weight=1.0,
        split_label=split_label,
        a_label=a_label,
        b_label=b_label,
        tie_label=tie_label,
    )


def weighted_vote(
    judgments: Iterable[Judgment],
    weights: Mapping[Hashable, float],
    *,
    default_weight: float = 1.0,
    split_label: Hashable = TIE,
    a_label: Hashable = A,
    b_label: Hashable = B,
    tie_label: Hashable = TIE,
) -> dict[Hashable, AggregatedLabel]:
    """Return the label with the largest summed annotator weight per item (trust-weighted vote).

    ``weights`` maps annotator to a non-negative trust, e.g. gold accuracy; annotators not in
    it count ``default_weight``. Confidence and soft label use the weighted shares.
    """
    results: dict[Hashable, AggregatedLabel] = {}
    for item, votes in _group(judgments).items():
        totals: dict[Hashable, float] = defaultdict(float)
        for annotator, label in votes:
            weight = float(weights.get(annotator, default_weight))
            if weight < 0:
                raise ValueError(f"annotator {annotator!r} has a negative weight")
            totals[label] += weight
        results[item] = _decide(totals, len(votes), split_label, a_label, b_label, tie_label)
    return results


def _index(values: Iterable[Hashable]) -> dict[Hashable, int]:
    """Map each distinct value to a position in first-seen order."""
    positions: dict[Hashable, int] = {}
    for value in values:
        positions.setdefault(value, len(positions))
    return positions


def dawid_skene(
    judgments: Sequence[Judgment],
    *,
    classes: Sequence[Hashable] | None = None,
    max_iter: int = 200,
    tol: float = 1e-8,
    smoothing: float = 0.01,
    a_label: Hashable = A,
    b_label: Hashable = B,
    tie_label: Hashable = TIE,
) -> DawidSkeneResult:
    """Fit per-annotator confusion matrices by EM and return each item's most probable label.

    Follows Dawid & Skene (1979): start from each item's vote shares (their eq. 3.1), then
    alternate the M-step (eqs 2.3-2.4) and E-step (eq. 2.5). ``smoothing`` adds a pseudo-count
    to every confusion cell so sparse annotators do not get certainty; 0 is the paper's MLE.
    An annotator may label the same item more than once. The soft label comes from the raw
    votes, as in ``majority_vote``; the posteriors are in ``distribution``.
    """
    judgments = list(judgments)
    if not judgments:
        raise ValueError("no judgments")
    item_index = _index(j[0] for j in judgments)
    annotator_index = _index(j[1] for j in judgments)
    if classes is None:
        seen = _index(j[2] for j in judgments)
        try:
            classes = sorted(seen)
        except TypeError:
            classes = list(seen)
    class_index = {label: k for k, label in enumerate(classes)}
    unknown = {j[2] for j in judgments} - set(class_index)
    if unknown:
        raise ValueError(f"labels {sorted(map(str, unknown))} are not among the classes")

    items = np.fromiter((item_index[j[0]] for j in judgments), dtype=np.int64)
    annotators = np.fromiter((annotator_index[j[1]] for j in judgments), dtype=np.int64)
    observed = np.fromiter((class_index[j[2]] for j in judgments), dtype=np.int64)
    n_items, n_annotators, n_classes = len(item_index), len(annotator_index), len(classes)

    # Initial posteriors: share of each item's votes per class (Dawid & Skene 1979, eq. 3.1)
    posteriors = np.zeros((n_items, n_classes))
    np.add.at(posteriors, (items, observed), 1.0)
    posteriors /= posteriors.sum(axis=1, keepdims=True)

    previous = -np.inf
    log_likelihood = -np.inf
    converged = False
    n_iter = 0
    confusion = np.full((n_annotators, n_classes, n_classes), 1.0 / n_classes)
    priors = np.full(n_classes, 1.0 / n_classes)
    for iteration in range(1, max_iter + 1):
        n_iter = iteration
        priors, confusion = _m_step(
            posteriors, items, annotators, observed, n_annotators, n_classes, smoothing
        )
        posteriors, log_likelihood = _e_step(
            priors, confusion, items, annotators, observed, n_items
        )
        if abs(log_likelihood - previous) <= tol * max(1.0, abs(log_likelihood)):
            converged = True
            break
        previous = log_likelihood

    items_in_order = list(item_index)
    votes_per_item = np.bincount(items, minlength=n_items)
    vote_counts = np.zeros((n_items, n_classes))
    np.add.at(vote_counts, (items, observed), 1.0)
    labels: dict[Hashable, AggregatedLabel] = {}
    for position, item in enumerate(items_in_order):
        distribution = {classes[k]: float(posteriors[position, k]) for k in range(n_classes)}
        best = int(np.argmax(posteriors[position]))
        labels[item] = AggregatedLabel(
            label=classes[best],
            confidence=float(posteriors[position, best]),
            soft_label=soft_label(
                dict(zip(classes, vote_counts[position], strict=True)), a_label, b_label, tie_label
            ),
            n_votes=int(votes_per_item[position]),
            split=False,
            distribution=distribution,
        )
    return DawidSkeneResult(
        labels=labels,
        classes=list(classes),
        class_priors={classes[k]: float(priors[k]) for k in range(n_classes)},
        confusion={a: confusion[k] for a, k in annotator_index.items()},
        log_likelihood=float(log_likelihood),
        n_iter=n_iter,
        converged=converged,
    )


def _m_step(
    posteriors: np.ndarray,
    items: np.ndarray,
    annotators: np.ndarray,
    observed: np.ndarray,
    n_annotators: int,
    n_classes: int,
    smoothing: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Return class priors and confusion[annotator, true, observed] given item posteriors."""
    # p_j = mean_i T_ij; pi^k_jl proportional to sum_i T_ij n^k_il  (Dawid & Skene 1979, 2.3-2.4)
    priors = posteriors.mean(axis=0)
    cells = annotators * n_classes + observed
    confusion = np.empty((n_annotators, n_classes, n_classes))
    for true_class in range(n_classes):
        mass = np.bincount(
            cells, weights=posteriors[items, true_class], minlength=n_annotators * n_classes
        )
        confusion[:, true_class, :] = mass.reshape(n_annotators, n_classes)
    confusion += smoothing
    totals = confusion.sum(axis=2, keepdims=True)
    confusion = np.divide(
        confusion, totals, out=np.full_like(confusion, 1.0 / n_classes), where=totals > 0
    )
    return priors, confusion


def _e_step(
    priors: np.ndarray,
    confusion: np.ndarray,
    items: np.ndarray,
    annotators: np.ndarray,
    observed: np.ndarray,
    n_items: int,
) -> tuple[np.ndarray, float]:
    """Return item posteriors and the data log-likelihood under the current parameters."""
    # T_ij proportional to p_j prod_k prod_l (pi^k_jl)^(n^k_il)  (Dawid & Skene 1979, eq. 2.5)
    n_classes = priors.size
    with np.errstate(divide="ignore"):
        log_confusion = np.log(confusion)
        log_joint = np.tile(np.log(priors), (n_items, 1))
    for true_class in range(n_classes):
        log_joint[:, true_class] += np.bincount(
            items, weights=log_confusion[annotators, true_class, observed], minlength=n_items
        )
    log_evidence = logsumexp(log_joint, axis=1)
    impossible = ~np.isfinite(log_evidence)
    log_evidence_safe = np.where(impossible, 0.0, log_evidence)
    posteriors = np.exp(log_joint - log_evidence_safe[:, None])
    posteriors[impossible] = 1.0 / n_classes
    return posteriors, float(log_evidence[~impossible].sum())


def label_accuracy(
    aggregated: Mapping[Hashable, AggregatedLabel], truth: Mapping[Hashable, Any]
) -> float:
    """Return the share of items with known truth whose aggregated label matches it."""
    shared = [item for item in truth if item in aggregated]
    if not shared:
        return float("nan")
    return sum(aggregated[item].label == truth[item] for item in shared) / len(shared)
