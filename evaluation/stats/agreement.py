"""Inter-rater agreement: Krippendorff's alpha, Fleiss' and Cohen's kappa, Kendall's tau-b.

Pure numpy/scipy, no Django. Reliability data follow Krippendorff's layout: one row per rater,
one column per unit, ``None`` or ``NaN`` where a rater did not code a unit. Labels may be
numbers or strings (e.g. the pairwise labels ``"A"``, ``"B"``, ``"tie"``, ``"both_bad"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVELS = ("nominal", "ordinal", "interval", "ratio")
KAPPA_WEIGHTS = (None, "linear", "quadratic")


@dataclass(frozen=True)
class BootstrapCI:
    """Point estimate with a percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    n_boot: int
    n_valid: int


def _is_missing(value: Any) -> bool:
    """Return True for None and float NaN."""
    return value is None or (isinstance(value, float) and value != value)


def _factorize(values: Any, categories: Sequence | None = None) -> tuple[np.ndarray, list]:
    """Return integer codes (-1 = missing) and the ordered category list of an array of labels."""
    array = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    shape = array.shape
    if array.dtype.kind in "fiub" and categories is None:
        flat = array.astype(float).ravel()
        present = ~np.isnan(flat)
        observed = flat[present]
        codes = np.full(flat.shape, -1, dtype=np.int64)
        low = observed.min() if observed.size else 0.0
        span = observed.max() - low if observed.size else 0.0
        if span < 4 * observed.size + 1024 and np.array_equal(observed, np.round(observed)):
            # Small integer codes: a counting pass instead of a sort.
            offsets = (observed - low).astype(np.int64)
            used = np.bincount(offsets) > 0
            codes[present] = (np.cumsum(used) - 1)[offsets]
            uniques = np.flatnonzero(used) + low
        else:
            uniques, codes[present] = np.unique(observed, return_inverse=True)
        return codes.reshape(shape), uniques.tolist()
    flat = array.ravel()
    if categories is not None:
        index = {category: position for position, category in enumerate(categories)}
        if len(index) != len(categories):
            raise ValueError("categories must be distinct")
        try:
            codes = np.fromiter(
                (-1 if _is_missing(x) else index[x] for x in flat), dtype=np.int64, count=flat.size
            )
        except KeyError as error:
            raise ValueError(f"label {error.args[0]!r} is not among the categories") from None
        return codes.reshape(shape), list(categories)
    seen: dict[Any, int] = {}
    code_of = seen.setdefault
    codes = np.fromiter(
        (-1 if _is_missing(x) else code_of(x, len(seen)) for x in flat),
        dtype=np.int64,
        count=flat.size,
    )
    try:
        ordered = sorted(seen)
    except TypeError:
        raise ValueError("labels of mixed types cannot be ordered; pass categories") from None
    remap = np.empty(len(seen) + 1, dtype=np.int64)
    remap[-1] = -1
    for position, label in enumerate(ordered):
        remap[seen[label]] = position
    return remap[codes].reshape(shape), ordered


def _as_reliability_codes(
    reliability_data: Any, categories: Sequence | None = None
) -> tuple[np.ndarray, list]:
    """Return a raters x units code matrix and its category list."""
    codes, values = _factorize(reliability_data, categories)
    if codes.ndim != 2:
        raise ValueError("reliability_data must be 2-D: raters x units")
    return codes, values


def rating_counts(
    reliability_data: Any, categories: Sequence | None = None
) -> tuple[list, np.ndarray]:
    """Return the categories and the units x categories count matrix of reliability data."""
    codes, values = _as_reliability_codes(reliability_data, categories)
    return values, _unit_counts(codes, len(values))


def _unit_counts(codes: np.ndarray, n_values: int) -> np.ndarray:
    """Count, for every unit (column), how many raters chose each value."""
    n_units = codes.shape[1]
    width = n_values + 1  # one spare column collects the missing cells
    cells = np.where(codes < 0, n_values, codes) + width * np.arange(n_units)
    counts = np.bincount(cells.ravel(), minlength=n_units * width)
    return counts.reshape(n_units, width)[:, :n_values].astype(float)


def coincidence_matrix(
    reliability_data: Any, categories: Sequence | None = None
) -> tuple[list, np.ndarray]:
    """Return the values and Krippendorff's coincidence matrix o_ck of reliability data."""
    codes, values = _as_reliability_codes(reliability_data, categories)
    return values, _coincidences(_unit_counts(codes, len(values)))


def _coincidences(unit_counts: np.ndarray) -> np.ndarray:
    """Build o_ck from per-unit value counts, skipping units with fewer than two values."""
    # o_ck = sum_u (n_uc n_uk - [c=k] n_uc) / (m_u - 1)  (Krippendorff 2011, section C)
    pairable = unit_counts.sum(axis=1)
    keep = pairable >= 2
    counts = unit_counts[keep]
    scaled = counts / (pairable[keep] - 1)[:, None]
    return scaled.T @ counts - np.diag(scaled.sum(axis=0))


def _delta_squared(level: str, values: list, marginals: np.ndarray) -> np.ndarray:
    """Return the metric difference matrix delta^2_ck for one level of measurement."""
    # Difference functions from Krippendorff (2011) "Computing Krippendorff's Alpha-Reliability"
    n_values = len(values)
    if level == "nominal":
        return 1.0 - np.eye(n_values)
    if level == "ordinal":
        # (sum_{g=c..k} n_g - (n_c + n_k)/2)^2 = (midrank_k - midrank_c)^2
        midrank = np.cumsum(marginals) - marginals / 2.0
        return (midrank[:, None] - midrank[None, :]) ** 2
    try:
        numeric = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{level} level needs numeric values") from None
    if level == "interval":
        return (numeric[:, None] - numeric[None, :]) ** 2
    if level == "ratio":
        if np.any(numeric < 0):
            raise ValueError("ratio level needs non-negative values")
        total = numeric[:, None] + numeric[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(total == 0, 0.0, (numeric[:, None] - numeric[None, :]) / total)
        return ratio**2
    raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


def krippendorff_alpha(
    reliability_data: Any, level: str = "nominal", categories: Sequence | None = None
) -> float:
    """Return Krippendorff's alpha of raters x units data; NaN when there is no variation."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    codes, values = _as_reliability_codes(reliability_data, categories)
    if not values:
        return float("nan")
    coincidences = _coincidences(_unit_counts(codes, len(values)))
    marginals = coincidences.sum(axis=1)
    total = marginals.sum()
    if total <= 1:
        return float("nan")
    delta = _delta_squared(level, values, marginals)
    # alpha = 1 - (n - 1) sum o_ck d_ck / sum n_c n_k d_ck  (Krippendorff 2011, eq. for D_o/D_e)
    observed = float((coincidences * delta).sum())
    expected = float((np.outer(marginals, marginals) * delta).sum()) / (total - 1)
    if expected == 0:
        return float("nan")
    return 1.0 - observed / expected


def fleiss_kappa(counts: Any) -> float:
    """Return Fleiss' kappa of a subjects x categories count matrix with equal raters per row."""
    table = np.asarray(counts, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        raise ValueError("counts must be a non-empty subjects x categories matrix")
    raters = table.sum(axis=1)
    if not np.allclose(raters, raters[0]):
        raise ValueError("every subject must have the same number of ratings")
    n = raters[0]
    if n < 2:
        raise ValueError("Fleiss' kappa needs at least two ratings per subject")
    # P_i = (sum_j n_ij^2 - n) / (n (n - 1)); kappa = (P - P_e) / (1 - P_e)  (Fleiss 1971, eqs 2-9)
    agreement = ((table**2).sum(axis=1) - n) / (n * (n - 1))
    shares = table.sum(axis=0) / table.sum()
    chance = float((shares**2).sum())
    if chance == 1.0:
        return float("nan")
    return (float(agreement.mean()) - chance) / (1.0 - chance)


def _disagreement_weights(weights: Any, n_values: int) -> np.ndarray:
    """Return a V x V disagreement weight matrix for Cohen's kappa."""
    positions = np.arange(n_values, dtype=float)
    distance = np.abs(positions[:, None] - positions[None, :])
    if weights is None:
        return (distance > 0).astype(float)
    if isinstance(weights, str):
        if weights == "linear":
            return distance
        if weights == "quadratic":
            return distance**2
        raise ValueError(f"weights must be one of {KAPPA_WEIGHTS} or a matrix, got {weights!r}")
    matrix = np.asarray(weights, dtype=float)
    if matrix.shape != (n_values, n_values):
        raise ValueError(f"a weight matrix must be {n_values} x {n_values}")
    return matrix


def cohen_kappa(
    labels_a: Sequence,
    labels_b: Sequence,
    weights: str | Any | None = None,
    categories: Sequence | None = None,
) -> float:
    """Return Cohen's (optionally weighted) kappa of two raters; pairs with a missing label drop."""
    if len(labels_a) != len(labels_b):
        raise ValueError("labels_a and labels_b must have the same length")
    codes, values = _factorize(np.array([list(labels_a), list(labels_b)], dtype=object), categories)
    both = (codes[0] >= 0) & (codes[1] >= 0)
    if not both.any():
        return float("nan")
    n_values = len(values)
    table = np.bincount(
        codes[0, both] * n_values + codes[1, both], minlength=n_values * n_values
    ).reshape(n_values, n_values)
    observed = table / table.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    disagreement = _disagreement_weights(weights, n_values)
    # kappa_w = 1 - sum w_ij p_ij / sum w_ij p_i. p_.j  (Cohen 1968); w = 1 - I is Cohen (1960)
    expected_disagreement = float((disagreement * expected).sum())
    if expected_disagreement == 0:
        return float("nan")
    return 1.0 - float((disagreement * observed).sum()) / expected_disagreement


def _pair_signs(scores: np.ndarray) -> np.ndarray:
    """Return sign(x_i - x_j) over all pairs i < j along the last axis."""
    first, second = np.triu_indices(scores.shape[-1], k=1)
    return np.sign(scores[..., first] - scores[..., second])


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Return Kendall's tau-b between two rankings or score lists; ties are allowed."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("x and y must be 1-D and of equal length")
    sign_a, sign_b = _pair_signs(a), _pair_signs(b)
    # tau_b = (n_c - n_d) / sqrt((n_0 - n_1)(n_0 - n_2))  (Kendall 1945; Agresti 2010, sec. 7.1)
    denominator = np.sqrt(float((sign_a**2).sum()) * float((sign_b**2).sum()))
    if denominator == 0:
        return float("nan")
    return float((sign_a * sign_b).sum()) / denominator


def mean_pairwise_kendall_tau(rankings: Sequence[Sequence[Sequence[float] | None]]) -> float:
    """Return the mean tau-b over all rater pairs of all K-way items (item -> rater -> scores).

    A rater who did not rank an item is ``None``; pairs where a ranking is constant are skipped.
    """
    items = [item for item in rankings if item is not None]
    if not items:
        return float("nan")
    n_raters = max(len(item) for item in items)
    sizes = {len(r) for item in items for r in item if r is not None}
    if len(sizes) > 1:
        raise ValueError("all rankings must rank the same number of responses")
    if not sizes:
        return float("nan")
    size = sizes.pop()
    scores = np.full((len(items), n_raters, size), np.nan)
    for i, item in enumerate(items):
        for r, ranking in enumerate(item):
            if ranking is not None:
                scores[i, r] = np.asarray(ranking, dtype=float)
    present = ~np.isnan(scores).any(axis=2)
    signs = np.nan_to_num(_pair_signs(scores))
    numerator = np.einsum("irp,isp->irs", signs, signs)
    squares = (signs**2).sum(axis=2)
    denominator = np.sqrt(squares[:, :, None] * squares[:, None, :])
    upper = np.triu(np.ones((n_raters, n_raters), dtype=bool), k=1)
    valid = present[:, :, None] & present[:, None, :] & upper[None] & (denominator > 0)
    if not valid.any():
        return float("nan")
    return float((numerator[valid] / denominator[valid]).mean())


def percent_agreement(reliability_data: Any, ties: str = "count", tie_label: Any = "tie") -> float:
    """Return the mean share of agreeing rater pairs per unit (units with two or more labels).

    ``ties="count"`` treats a tie as an ordinary label; ``ties="exclude"`` drops tie votes first.
    """
    if ties not in ("count", "exclude"):
        raise ValueError("ties must be 'count' or 'exclude'")
    codes, values = _as_reliability_codes(reliability_data)
    counts = _unit_counts(codes, len(values))
    if ties == "exclude" and tie_label in values:
        counts[:, values.index(tie_label)] = 0
    ratings = counts.sum(axis=1)
    keep = ratings >= 2
    if not keep.any():
        return float("nan")
    # P_i = sum_c n_ic (n_ic - 1) / (m_i (m_i - 1))  (Fleiss 1971, eq. 2, unequal m_i)
    agreeing = (counts[keep] * (counts[keep] - 1)).sum(axis=1)
    pairs = ratings[keep] * (ratings[keep] - 1)
    return float((agreeing / pairs).mean())


def bootstrap_ci(
    stat_fn: Callable[[Any], float],
    data: Any,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    axis: int = 0,
) -> BootstrapCI:
    """Return stat_fn(data) with a percentile interval from resampling units along ``axis``.

    Pass ``axis=1`` for raters x units reliability data. Replicates where the statistic is NaN
    (e.g. alpha on a resample with no variation) are left out and counted in ``n_valid``.
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must lie in (0, 1)")
    array = data if isinstance(data, np.ndarray) else np.asarray(data, dtype=object)
    n_units = array.shape[axis]
    if n_units == 0:
        raise ValueError("no units to resample")
    rng = np.random.default_rng(seed)
    estimate = float(stat_fn(array))
    replicates = np.empty(n_boot)
    for b in range(n_boot):
        replicates[b] = stat_fn(np.take(array, rng.integers(0, n_units, n_units), axis=axis))
    valid = replicates[~np.isnan(replicates)]
    if valid.size == 0:
        return BootstrapCI(estimate, float("nan"), float("nan"), n_boot, 0)
    low, high = np.quantile(valid, [alpha / 2, 1 - alpha / 2])
    return BootstrapCI(estimate, float(low), float(high), n_boot, int(valid.size))
