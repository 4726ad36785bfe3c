"""Reward-model metrics on (chosen, rejected) reward pairs. Pure numpy/scipy, no Django.

The model's preference probability is the Bradley-Terry one, P(chosen > rejected) =
sigmoid((r_chosen - r_rejected) / T), with temperature T = 1 unless fitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import minimize_scalar
from scipy.special import expit, log_expit


@dataclass(frozen=True)
class CalibrationBin:
    """One equal-width confidence bin of a reliability diagram."""

    lower: float
    upper: float
    mean_confidence: float | None
    accuracy: float | None
    count: int


@dataclass(frozen=True)
class SubsetAccuracy:
    """Pairwise accuracy on a subset of pairs."""

    n: int
    accuracy: float | None
    mean_abs_margin: float | None


def _pairs(chosen: Sequence[float], rejected: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Return the two reward arrays after checking their shapes."""
    c = np.asarray(chosen, dtype=float)
    r = np.asarray(rejected, dtype=float)
    if c.shape != r.shape or c.ndim != 1:
        raise ValueError("chosen and rejected must be 1-D and of equal length")
    return c, r


def pairwise_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float:
    """Return the share of pairs where the chosen reward is higher; equal rewards count half."""
    c, r = _pairs(chosen, rejected)
    if c.size == 0:
        return float("nan")
    return float(np.mean(c > r) + 0.5 * np.mean(c == r))


def bt_nll(
    chosen: Sequence[float],
    rejected: Sequence[float],
    soft_labels: Sequence[float] | None = None,
    temperature: float = 1.0,
) -> float:
    """Return the mean negative log-likelihood of the labels under the BT probability.

    ``soft_labels`` are the human probabilities that the chosen answer is better (default 1).
    """
    c, r = _pairs(chosen, rejected)
    margin = (c - r) / temperature
    y = np.ones_like(margin) if soft_labels is None else np.asarray(soft_labels, dtype=float)
    # Bradley-Terry loss as in reward modelling (Ouyang et al. 2022, eq. 1), soft-label form
    return float(-np.mean(y * log_expit(margin) + (1 - y) * log_expit(-margin)))


def randomized_pairs(
    chosen: Sequence[float], rejected: Sequence[float], seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return scores r_A - r_B and labels (1 when A is the chosen answer) after random swaps."""
    c, r = _pairs(chosen, rejected)
    rng = np.random.default_rng(seed)
    a_is_chosen = rng.random(c.size) < 0.5
    scores = np.where(a_is_chosen, c - r, r - c)
    return scores, a_is_chosen.astype(int)


def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Return ROC-AUC as the Mann-Whitney probability that a positive outscores a negative."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # AUC = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg), mid-ranks for ties (Hanley 1982)
    ranks = stats.rankdata(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def roc_auc_random_order(
    chosen: Sequence[float], rejected: Sequence[float], seed: int = 0
) -> float:
    """Return ROC-AUC of r_A - r_B for "A is chosen" with A/B order randomised by ``seed``."""
    return roc_auc(*randomized_pairs(chosen, rejected, seed))


def reliability_diagram(
    confidences: Sequence[float], correct: Sequence[float], n_bins: int = 10
) -> list[CalibrationBin]:
    """Return equal-width bins ((m-1)/M, m/M] with mean confidence, accuracy and count."""
    conf = np.asarray(confidences, dtype=float)
    hits = np.asarray(correct, dtype=float)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    index = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    bins = []
    for m in range(n_bins):
        members = index == m
        count = int(members.sum())
        bins.append(
            CalibrationBin(
                lower=float(edges[m]),
                upper=float(edges[m + 1]),
                mean_confidence=float(conf[members].mean()) if count else None,
                accuracy=float(hits[members].mean()) if count else None,
                count=count,
            )
        )
    return bins


def expected_calibration_error(
    confidences: Sequence[float], correct: Sequence[float], n_bins: int = 10
) -> float:
    """Return ECE = sum_m |B_m| / n * |acc(B_m) - conf(B_m)| over equal-width bins."""
    bins = reliability_diagram(confidences, correct, n_bins)
    total = sum(b.count for b in bins)
    if total == 0:
        return float("nan")
    # Guo et al. 2017, "On Calibration of Modern Neural Networks", eq. 3
    return float(
        sum(b.count / total * abs(b.accuracy - b.mean_confidence) for b in bins if b.count)
    )


def pair_confidences(
    chosen: Sequence[float], rejected: Sequence[float], temperature: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Return the model's top-label confidence max(p, 1 - p) and whether it picked the chosen."""
    c, r = _pairs(chosen, rejected)
    p = expit((c - r) / temperature)
    correct = np.where(c > r, 1.0, np.where(c < r, 0.0, 0.5))
    return np.maximum(p, 1 - p), correct


def fit_temperature(
    chosen: Sequence[float],
    rejected: Sequence[float],
    soft_labels: Sequence[float] | None = None,
) -> float:
    """Return the temperature T minimising the validation BT NLL (temperature scaling)."""
    # Temperature scaling, Guo et al. 2017, section 4.2; searched on log T for scale invariance
    result = minimize_scalar(
        lambda log_t: bt_nll(chosen, rejected, soft_labels, float(np.exp(log_t))),
        bounds=(-7.0, 7.0),
        method="bounded",
        options={"xatol": 1e-8},
    )
    return float(np.exp(result.x))


def margin_histogram(
    chosen: Sequence[float], rejected: Sequence[float], bins: int | Sequence[float] = 20
) -> tuple[np.ndarray, np.ndarray]:
    """Return histogram counts and bin edges of the reward margins r_chosen - r_rejected."""
    c, r = _pairs(chosen, rejected)
    return np.histogram(c - r, bins=bins)


def length_correlation(rewards: Sequence[float], lengths: Sequence[float]) -> dict[str, float]:
    """Return Spearman and Pearson correlations (with p-values) of reward with length."""
    x = np.asarray(rewards, dtype=float)
    y = np.asarray(lengths, dtype=float)
    spearman = stats.spearmanr(x, y)
    pearson = stats.pearsonr(x, y)
    return {
        "spearman": float(spearman.statistic),
        "spearman_p": float(spearman.pvalue),
        "pearson": float(pearson.statistic),
        "pearson_p": float(pearson.pvalue),
    }


def _subset(c: np.ndarray, r: np.ndarray, mask: np.ndarray) -> SubsetAccuracy:
    """Return accuracy and mean |margin| on the masked pairs."""
    n = int(mask.sum())
    if n == 0:
        return SubsetAccuracy(0, None, None)
    return SubsetAccuracy(
        n, pairwise_accuracy(c[mask], r[mask]), float(np.abs(c[mask] - r[mask]).mean())
    )


def subset_accuracy(
    chosen: Sequence[float],
    rejected: Sequence[float],
    *,
    agreement: Sequence[float] | None = None,
    ties: Sequence[bool] | None = None,
    low_agreement: float = 0.6,
) -> dict[str, SubsetAccuracy]:
    """Return accuracy overall, on low-/high-agreement pairs and on pairs humans called a tie.

    For tie pairs the order is arbitrary, so accuracy should sit near 0.5 and a small mean
    |margin| is the better sign.
    """
    c, r = _pairs(chosen, rejected)
    everything = np.ones(c.size, dtype=bool)
    tie_mask = np.zeros(c.size, dtype=bool) if ties is None else np.asarray(ties, dtype=bool)
    result = {"all": _subset(c, r, everything & ~tie_mask), "tie": _subset(c, r, tie_mask)}
    if agreement is not None:
        level = np.asarray(agreement, dtype=float)
        result["low_agreement"] = _subset(c, r, (level < low_agreement) & ~tie_mask)
        result["high_agreement"] = _subset(c, r, (level >= low_agreement) & ~tie_mask)
    return result


def evaluate_reward_model(
    chosen: Sequence[float],
    rejected: Sequence[float],
    *,
    soft_labels: Sequence[float] | None = None,
    agreement: Sequence[float] | None = None,
    ties: Sequence[bool] | None = None,
    chosen_lengths: Sequence[float] | None = None,
    rejected_lengths: Sequence[float] | None = None,
    temperature: float = 1.0,
    n_bins: int = 10,
    seed: int = 0,
) -> dict:
    """Return every metric of this module for one evaluation split as a plain dict.

    Fit ``temperature`` on a validation split with ``fit_temperature`` and pass it here.
    """
    c, r = _pairs(chosen, rejected)
    decisive = np.ones(c.size, dtype=bool) if ties is None else ~np.asarray(ties, dtype=bool)
    confidences, correct = pair_confidences(c[decisive], r[decisive], temperature)
    counts, edges = margin_histogram(c, r)
    report = {
        "n_pairs": int(c.size),
        "accuracy": pairwise_accuracy(c[decisive], r[decisive]),
        "nll": bt_nll(c, r, soft_labels),
        "nll_at_temperature": bt_nll(c, r, soft_labels, temperature),
        "temperature": temperature,
        "roc_auc": roc_auc_random_order(c[decisive], r[decisive], seed),
        "ece": expected_calibration_error(confidences, correct, n_bins),
        "reliability": reliability_diagram(confidences, correct, n_bins),
        "margin_histogram": {"counts": counts.tolist(), "edges": edges.tolist()},
        "subsets": subset_accuracy(c, r, agreement=agreement, ties=ties),
    }
    if chosen_lengths is not None and rejected_lengths is not None:
        rewards = np.concatenate([c, r])
        lengths = np.concatenate([np.asarray(chosen_lengths), np.asarray(rejected_lengths)])
        report["length_correlation"] = length_correlation(rewards, lengths)
    return report
