"""Win rate against a baseline, with prompt-clustered bootstrap CIs and length control.

Numpy/scipy only, no Django.

Convention: win rate = (W + 0.5 T) / (W + T + L). Ties count half; both-bad votes are reported
but left out, since neither answer was acceptable and that says nothing about which is better.
Several votes on the same prompt are correlated, so the bootstrap resamples prompts, not votes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

CONVENTION = "(W + 0.5 T) / (W + T + L); both-bad excluded"
OUTCOMES = ("win", "tie", "loss", "both_bad")
_BLOCK = 256


@dataclass(frozen=True)
class WinRate:
    """Raw counts, win rate and its bootstrap interval."""

    wins: int
    ties: int
    losses: int
    both_bad: int
    win_rate: float | None
    ci_low: float | None
    ci_high: float | None
    n_prompts: int
    bootstrap: np.ndarray
    convention: str = CONVENTION


@dataclass(frozen=True)
class LengthControlledWinRate:
    """Win rate at zero length difference from a logistic fit on the length feature."""

    win_rate: float | None
    raw_win_rate: float | None
    intercept: float
    length_coefficient: float
    length_scale: float
    ci_low: float | None
    ci_high: float | None
    n_votes: int


def vs_baseline(
    battles: Iterable[tuple[Hashable, Hashable, Hashable, str]], model: Hashable, baseline: Hashable
) -> tuple[list[Hashable], list[str]]:
    """Return (prompt ids, outcomes for ``model``) from ``(prompt, model_a, model_b, outcome)``.

    Battle outcomes are ``"A"``, ``"B"``, ``"tie"``, ``"both_bad"``; other pairings are skipped.
    """
    prompts: list[Hashable] = []
    outcomes: list[str] = []
    as_a = {"A": "win", "B": "loss", "tie": "tie", "both_bad": "both_bad"}
    as_b = {"A": "loss", "B": "win", "tie": "tie", "both_bad": "both_bad"}
    for prompt, model_a, model_b, outcome in battles:
        if (model_a, model_b) == (model, baseline):
            mapping = as_a
        elif (model_a, model_b) == (baseline, model):
            mapping = as_b
        else:
            continue
        if outcome not in mapping:
            raise ValueError(f"unknown outcome {outcome!r}")
        prompts.append(prompt)
        outcomes.append(mapping[outcome])
    return prompts, outcomes


def _codes(outcomes: Sequence[str]) -> np.ndarray:
    """Map outcome names to 0..3 in the order of OUTCOMES."""
    index = {name: k for k, name in enumerate(OUTCOMES)}
    try:
        return np.fromiter((index[o] for o in outcomes), dtype=np.int64, count=len(outcomes))
    except KeyError as error:
        raise ValueError(f"outcome {error.args[0]!r} is not one of {OUTCOMES}") from None


def _clusters(prompt_ids: Sequence[Hashable] | None, n: int) -> np.ndarray:
    """Return a cluster index per vote; every vote is its own cluster without prompt ids."""
    if prompt_ids is None:
        return np.arange(n)
    if len(prompt_ids) != n:
        raise ValueError("prompt_ids and outcomes must have the same length")
    seen: dict[Hashable, int] = {}
    return np.fromiter((seen.setdefault(p, len(seen)) for p in prompt_ids), dtype=np.int64, count=n)


def _rate(counts: np.ndarray) -> np.ndarray:
    """Return (W + T/2) / (W + T + L) along the last axis; NaN without decisive votes or ties."""
    wins, ties, losses = counts[..., 0], counts[..., 1], counts[..., 2]
    denominator = wins + ties + losses
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (wins + 0.5 * ties) / denominator, np.nan)


def _cluster_weights(rng: np.random.Generator, n_clusters: int, size: int) -> np.ndarray:
    """Return how often each cluster is drawn in ``size`` resamples of all clusters."""
    picks = rng.integers(0, n_clusters, size=(size, n_clusters))
    picks += n_clusters * np.arange(size)[:, None]
    return np.bincount(picks.ravel(), minlength=size * n_clusters).reshape(size, n_clusters)


def win_rate(
    outcomes: Sequence[str],
    prompt_ids: Sequence[Hashable] | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> WinRate:
    """Return counts and the win rate with a percentile CI that resamples prompts.

    ``outcomes`` are from the model's side: ``"win"``, ``"tie"``, ``"loss"``, ``"both_bad"``.
    """
    codes = _codes(outcomes)
    clusters = _clusters(prompt_ids, len(codes))
    n_clusters = int(clusters.max()) + 1 if codes.size else 0
    per_cluster = np.zeros((n_clusters, 4))
    np.add.at(per_cluster, (clusters, codes), 1.0)
    totals = per_cluster.sum(axis=0)
    point = _rate(totals)
    replicates = np.empty(0)
    low = high = None
    if n_boot > 0 and n_clusters > 0:
        rng = np.random.default_rng(seed)
        blocks = []
        for start in range(0, n_boot, _BLOCK):
            draws = _cluster_weights(rng, n_clusters, min(_BLOCK, n_boot - start))
            blocks.append(_rate(draws @ per_cluster))
        replicates = np.concatenate(blocks)
        valid = replicates[~np.isnan(replicates)]
        if valid.size:
            low, high = (float(v) for v in np.quantile(valid, [alpha / 2, 1 - alpha / 2]))
    wins, ties, losses, both_bad = (int(v) for v in totals) if n_clusters else (0, 0, 0, 0)
    return WinRate(
        wins=wins,
        ties=ties,
        losses=losses,
        both_bad=both_bad,
        win_rate=None if np.isnan(point) else float(point),
        ci_low=low,
        ci_high=high,
        n_prompts=n_clusters,
        bootstrap=replicates,
    )


def _fit_logistic(
    features: np.ndarray, targets: np.ndarray, weights: np.ndarray, max_iter: int = 50
) -> np.ndarray:
    """Return weighted logistic-regression coefficients, one row per weight row (Newton)."""
    coefficients = np.zeros((weights.shape[0], features.shape[1]))
    ridge = 1e-9 * np.eye(features.shape[1])
    for _ in range(max_iter):
        # einsum keeps these small products off multithreaded BLAS
        p = expit(np.einsum("bk,nk->bn", coefficients, features))
        gradient = np.einsum("bn,nk->bk", weights * (targets - p), features)
        hessian = np.einsum("bn,ni,nj->bij", weights * p * (1 - p), features, features) + ridge
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        coefficients += np.clip(step, -5, 5)
        if np.abs(step).max() < 1e-10:
            break
    return coefficients


def length_controlled_win_rate(
    outcomes: Sequence[str],
    length_diff: Sequence[float],
    prompt_ids: Sequence[Hashable] | None = None,
    *,
    n_boot: int = 200,
    seed: int = 0,
    alpha: float = 0.05,
) -> LengthControlledWinRate:
    """Return the win rate predicted at zero length difference, with a prompt-clustered CI.

    Fits logit P(win) = b0 + b1 tanh(d / sd(d)) where d is the model's answer length minus the
    baseline's, as AlpacaEval 2.0's length-controlled win rate does (Dubois et al. 2024,
    section 3); the LC win rate is sigmoid(b0). A tie is half a win and half a loss; both-bad
    votes are dropped.
    """
    codes = _codes(outcomes)
    diffs = np.asarray(length_diff, dtype=float)
    if diffs.shape != codes.shape:
        raise ValueError("length_diff and outcomes must have the same length")
    clusters = _clusters(prompt_ids, len(codes))
    keep = codes != 3
    codes, diffs, clusters = codes[keep], diffs[keep], clusters[keep]
    raw = _rate(np.bincount(codes, minlength=4).astype(float))
    scale = float(diffs.std()) or 1.0
    feature = np.tanh(diffs / scale)
    # Duplicate each vote as a (y = 1) and a (y = 0) row weighted by its win share.
    win_share = np.select([codes == 0, codes == 1], [1.0, 0.5], default=0.0)
    features = np.column_stack([np.ones(2 * feature.size), np.concatenate([feature, feature])])
    targets = np.concatenate([np.ones(feature.size), np.zeros(feature.size)])
    base_weights = np.concatenate([win_share, 1 - win_share])
    coefficients = _fit_logistic(features, targets, base_weights[None, :])[0]
    low = high = None
    if n_boot > 0 and codes.size:
        _, cluster_index = np.unique(clusters, return_inverse=True)
        n_clusters = int(cluster_index.max()) + 1
        rng = np.random.default_rng(seed)
        draws = _cluster_weights(rng, n_clusters, n_boot)[:, cluster_index]
        replicate_weights = np.concatenate([draws * win_share, draws * (1 - win_share)], axis=1)
        replicates = expit(_fit_logistic(features, targets, replicate_weights)[:, 0])
        low, high = (float(v) for v in np.quantile(replicates, [alpha / 2, 1 - alpha / 2]))
    return LengthControlledWinRate(
        win_rate=float(expit(coefficients[0])) if codes.size else None,
        raw_win_rate=None if np.isnan(raw) else float(raw),
        intercept=float(coefficients[0]),
        length_coefficient=float(coefficients[1]),
        length_scale=scale,
        ci_low=low,
        ci_high=high,
        n_votes=int(codes.size),
    )
