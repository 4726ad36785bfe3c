"""Bradley-Terry (and Elo) ratings of models from pairwise battles, Chatbot Arena style.

A battle is ``(model_a, model_b, outcome)`` with outcome ``"A"``, ``"B"``, ``"tie"`` or
``"both_bad"`` (Arena's ``"model_a"``, ``"model_b"``, ``"tie (bothbad)"`` are accepted too).
Battles come as tuples, as columns, or as rows already grouped by (model_a, model_b, outcome)
with a count each, so a database can aggregate them and Python never sees one row per battle.
Ratings use Arena's scale: ``rating = initial + scale * log_base(strength)``, i.e. a 400-point
gap means 10:1 odds, and the mean rating is 1000 unless an anchor model is pinned.

The fit works on aggregated pair counts (M models give M(M-1)/2 pairs) with Newton's method,
and the bootstrap draws the count vector from a multinomial, which is the same as resampling
battles with replacement; all replicates are fitted at once. Pure numpy/scipy, no Django.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.special import expit, log_expit

OUTCOME_CODES = {
    "A": 0,
    "model_a": 0,
    "B": 1,
    "model_b": 1,
    "tie": 2,
    "both_bad": 3,
    "tie (bothbad)": 3,
}
TIE_MODES = ("half", "exclude", "davidson")
BOTH_BAD_MODES = ("exclude", "tie")


@dataclass(frozen=True)
class PairCounts:
    """Battle outcomes per unordered model pair ``(first[p], second[p])``, first < second."""

    models: list[Hashable]
    first: np.ndarray
    second: np.ndarray
    first_wins: np.ndarray
    second_wins: np.ndarray
    ties: np.ndarray
    both_bad: np.ndarray

    @property
    def n_battles(self) -> int:
        """Return the number of battles, both-bad included."""
        return int(self.outcomes().sum())

    def outcomes(self) -> np.ndarray:
        """Return the P x 4 matrix (first wins, second wins, tie, both bad)."""
        return np.stack([self.first_wins, self.second_wins, self.ties, self.both_bad], axis=1)


@dataclass(frozen=True)
class ModelRating:
    """One leaderboard row."""

    model: Hashable
    rating: float
    ci_low: float
    ci_high: float
    rank: int
    wins: int
    losses: int
    ties: int
    both_bad: int

    @property
    def n_battles(self) -> int:
        """Return the model's battles, both-bad included."""
        return self.wins + self.losses + self.ties + self.both_bad


@dataclass(frozen=True)
class Leaderboard:
    """Ratings sorted best first, with bootstrap replicates when they were drawn."""

    rows: list[ModelRating]
    models: list[Hashable]
    ratings: np.ndarray
    bootstrap: np.ndarray | None
    tie_mode: str
    tie_parameter: float | None
    converged: bool

    def as_dict(self) -> dict[Hashable, float]:
        """Return model -> rating."""
        return {model: float(r) for model, r in zip(self.models, self.ratings, strict=True)}


class _FirstSeenIndex(dict):
    """Map each new key to the next integer on first lookup, so one pass both finds and codes."""

    def __missing__(self, key):
        code = self[key] = len(self)
        return code


def _factorize(*columns: Sequence) -> tuple[list[np.ndarray], list]:
    """Return integer codes per column over the distinct values of all, in first-seen order."""
    # One C-level dict lookup per value (map over a bound __getitem__); pandas.factorize and
    # np.unique cost as much or more on Python strings, which hash once and cache the hash.
    index = _FirstSeenIndex()
    codes = [
        np.fromiter(map(index.__getitem__, column), dtype=np.int64, count=len(column))
        for column in columns
    ]
    return codes, list(index)


def _battle_counts(count: Sequence | None, n: int) -> np.ndarray | None:
    """Return battles per row as floats, or None when every row is one battle."""
    if count is None:
        return None
    weights = np.asarray(count, dtype=float)
    if weights.shape != (n,):
        raise ValueError("count must have one entry per row")
    if not np.all(np.isfinite(weights) & (weights >= 0) & (weights == np.round(weights))):
        raise ValueError("count must hold non-negative whole numbers of battles")
    return weights


def pair_counts(
    battles: Iterable[tuple[Hashable, Hashable, str]] | None = None,
    *,
    model_a: Sequence | None = None,
    model_b: Sequence | None = None,
    outcome: Sequence | None = None,
    count: Sequence | None = None,
    models: Sequence[Hashable] | None = None,
) -> PairCounts:
    """Aggregate battles, given as tuples or as columns, into per-pair outcome counts.

    With ``count``, row k stands for ``count[k]`` identical battles, so rows already grouped by
    (model_a, model_b, outcome), e.g. by SQL ``GROUP BY``, give the same counts as the battles.
    """
    if battles is not None:
        rows = list(battles)
        model_a = [r[0] for r in rows]
        model_b = [r[1] for r in rows]
        outcome = [r[2] for r in rows]
    if model_a is None or model_b is None or outcome is None:
        raise ValueError("pass battles or the three columns model_a, model_b, outcome")
    if not len(model_a) == len(model_b) == len(outcome):
        raise ValueError("model_a, model_b and outcome must have equal lengths")
    weights = _battle_counts(count, len(model_a))
    (a, b), names = _factorize(model_a, model_b)
    n_seen = len(names)
    if models is not None:
        order = {m: k for k, m in enumerate(models)}
        missing = set(names) - set(order)
        if missing:
            raise ValueError(f"battles name models not in models: {sorted(map(str, missing))}")
        remap = np.asarray([order[n] for n in names], dtype=np.int64)
        names = list(models)
    else:
        remap = np.arange(n_seen)
    if np.any(a == b):
        raise ValueError("a model cannot battle itself")
    (outcome_codes,), outcome_names = _factorize(outcome)
    try:
        outcome_map = np.asarray([OUTCOME_CODES[o] for o in outcome_names], dtype=np.int64)
    except KeyError as error:
        raise ValueError(f"unknown outcome {error.args[0]!r}") from None
    # Count on the small (model, model, outcome name) grid, then fold it: a per-battle array
    # operation costs as much as the whole fit at a million battles.
    n_names = len(outcome_names)
    cells = np.bincount(
        (a * n_seen + b) * n_names + outcome_codes,
        weights=weights,
        minlength=n_seen * n_seen * n_names,
    ).reshape(n_seen, n_seen, n_names)
    n_models = len(names)
    # by_side[i, j, code]: battles with i as model A and j as model B, by outcome code
    by_side = np.zeros((n_models, n_models, 4))
    for name_code, code in enumerate(outcome_map):
        by_side[np.ix_(remap, remap, [code])] += cells[:, :, [name_code]]
    # Orient every battle as (low index, high index); A and B wins swap when the order flips.
    swap = [1, 0, 2, 3]
    first, second = np.triu_indices(n_models, k=1)
    per_pair = by_side[first, second] + by_side[second, first][:, swap]
    return PairCounts(
        models=names,
        first=first,
        second=second,
        first_wins=per_pair[:, 0],
        second_wins=per_pair[:, 1],
        ties=per_pair[:, 2],
        both_bad=per_pair[:, 3],
    )


def _fit_inputs(outcomes: np.ndarray, tie_mode: str, both_bad: str) -> tuple[np.ndarray, ...]:
    """Return (wins of first, wins of second, ties) arrays for the fit, last axis = pairs."""
    first_wins, second_wins = outcomes[..., 0], outcomes[..., 1]
    ties = outcomes[..., 2] + (outcomes[..., 3] if both_bad == "tie" else 0.0)
    if tie_mode == "half":
        # A tie counts as half a win for each side (Chatbot Arena's duplicated-tie trick).
        return first_wins + 0.5 * ties, second_wins + 0.5 * ties, np.zeros_like(ties)
    if tie_mode == "exclude":
        return first_wins, second_wins, np.zeros_like(ties)
    return first_wins, second_wins, ties


def _incidence(first: np.ndarray, second: np.ndarray, n_models: int) -> np.ndarray:
    """Return the P x M matrix with +1 at the first and -1 at the second model of each pair."""
    incidence = np.zeros((first.size, n_models))
    incidence[np.arange(first.size), first] = 1.0
    incidence[np.arange(first.size), second] = -1.0
    return incidence


def _per_model(values: np.ndarray, models: np.ndarray, n_models: int) -> np.ndarray:
    """Sum a B x P array into B x M by the model of each pair (no BLAS: tiny, many threads)."""
    rows = values.shape[0]
    index = (np.arange(rows)[:, None] * n_models + models[None, :]).ravel()
    sums = np.bincount(index, weights=values.ravel(), minlength=rows * n_models)
    return sums.reshape(rows, n_models)


def _bt_log_likelihood(theta, first, second, wins, losses, l2):
    """Return the BT log-likelihood per replicate (rows of theta)."""
    diff = theta[:, first] - theta[:, second]
    penalty = 0.5 * l2 * (theta**2).sum(axis=-1)
    return (wins * log_expit(diff) + losses * log_expit(-diff)).sum(axis=-1) - penalty


def fit_bradley_terry(
    first: np.ndarray,
    second: np.ndarray,
    wins: np.ndarray,
    losses: np.ndarray,
    n_models: int,
    *,
    l2: float = 0.0,
    tol: float = 1e-10,
    max_iter: int = 100,
) -> tuple[np.ndarray, np.ndarray]:
    """Return natural-log strengths (mean zero) maximising the BT likelihood, and convergence.

    ``wins``/``losses`` are (B x) P arrays: the first model of pair p beat the second ``wins[p]``
    times (fractions allowed). Rows are independent fits solved together by Newton's method.
    """
    wins = np.atleast_2d(np.asarray(wins, dtype=float))
    losses = np.atleast_2d(np.asarray(losses, dtype=float))
    n_reps = wins.shape[0]
    totals = wins + losses
    theta = np.zeros((n_reps, n_models))
    converged = np.zeros(n_reps, dtype=bool)
    current = _bt_log_likelihood(theta, first, second, wins, losses, l2)
    gauge = np.ones((n_models, n_models)) / n_models
    diagonal = np.arange(n_models)
    for _ in range(max_iter):
        active = ~converged
        if not active.any():
            break
        th, w, n = theta[active], wins[active], totals[active]
        # BT / logistic model: P(i beats j) = sigmoid(theta_i - theta_j)  (Bradley & Terry 1952)
        p = expit(th[:, first] - th[:, second])
        residual = w - n * p
        gradient = (
            _per_model(residual, first, n_models) - _per_model(residual, second, n_models) - l2 * th
        )
        curvature = n * p * (1 - p)
        # Negative Hessian = weighted graph Laplacian: -c_p off the diagonal, sum of c on it
        hessian = np.zeros((th.shape[0], n_models, n_models))
        hessian[:, first, second] = -curvature
        hessian[:, second, first] = -curvature
        hessian[:, diagonal, diagonal] = (
            _per_model(curvature, first, n_models) + _per_model(curvature, second, n_models) + l2
        )
        hessian += gauge
        try:
            step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        except np.linalg.LinAlgError:  # a resample lost every battle linking two groups
            step = (np.linalg.pinv(hessian) @ gradient[..., None])[..., 0]
        step -= step.mean(axis=1, keepdims=True)
        scale = np.ones(th.shape[0])
        new = th + step
        losses_active = n - w
        new_ll = _bt_log_likelihood(new, first, second, w, losses_active, l2)
        for _ in range(30):
            worse = new_ll < current[active] - 1e-12 * np.abs(current[active])
            if not worse.any():
                break
            scale[worse] /= 2
            new[worse] = th[worse] + scale[worse, None] * step[worse]
            new_ll[worse] = _bt_log_likelihood(
                new[worse], first, second, w[worse], losses_active[worse], l2
            )
        theta[active] = new
        current[active] = new_ll
        done = np.abs(scale[:, None] * step).max(axis=1) < tol
        converged[np.flatnonzero(active)[done]] = True
    return theta, converged


def fit_davidson(
    first: np.ndarray,
    second: np.ndarray,
    wins: np.ndarray,
    losses: np.ndarray,
    ties: np.ndarray,
    n_models: int,
    *,
    l2: float = 0.0,
) -> tuple[np.ndarray, float, bool]:
    """Return mean-zero natural-log strengths and the tie parameter nu of Davidson's model."""
    incidence = _incidence(first, second, n_models)

    def negative_log_likelihood(params):
        theta, log_nu = params[:-1], params[-1]
        half = 0.5 * (incidence @ theta)
        # Davidson (1970): P(i>j) = pi_i / (pi_i + pi_j + nu sqrt(pi_i pi_j)); tie gets nu sqrt(.)
        log_norm = np.logaddexp(np.logaddexp(half, -half), log_nu)
        p_win, p_loss = np.exp(half - log_norm), np.exp(-half - log_norm)
        p_tie = np.exp(log_nu - log_norm)
        value = wins * (half - log_norm) + losses * (-half - log_norm) + ties * (log_nu - log_norm)
        d_half = (
            wins * (1 - p_win + p_loss) - losses * (1 + p_win - p_loss) + ties * (p_loss - p_win)
        )
        grad_theta = 0.5 * (incidence.T @ d_half) - l2 * theta - theta.sum()
        grad_nu = float((ties * (1 - p_tie) - (wins + losses) * p_tie).sum())
        objective = -(value.sum() - 0.5 * l2 * theta @ theta - 0.5 * theta.sum() ** 2)
        return objective, -np.append(grad_theta, grad_nu)

    start = np.zeros(n_models + 1)
    result = minimize(
        negative_log_likelihood,
        start,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 1000, "gtol": 1e-9, "ftol": 1e-15},
    )
    theta = result.x[:-1] - result.x[:-1].mean()
    return theta, float(np.exp(result.x[-1])), bool(result.success)


def _to_rating(theta: np.ndarray, scale: float, base: float, initial_rating: float) -> np.ndarray:
    """Map natural-log strengths to the Elo scale."""
    # Arena's design matrix uses log(base) features: rating = initial + scale * theta / ln(base)
    return initial_rating + scale * theta / math.log(base)


def _check_connected(counts: PairCounts, weights: np.ndarray) -> None:
    """Raise when the comparison graph splits into parts that were never compared."""
    n_models = len(counts.models)
    used = weights > 0
    graph = coo_matrix(
        (np.ones(used.sum()), (counts.first[used], counts.second[used])),
        shape=(n_models, n_models),
    )
    n_parts, _ = connected_components(graph, directed=False)
    if n_parts > 1:
        raise ValueError("some models were never compared, directly or not; pass l2 > 0")


def _fit(
    counts: PairCounts,
    outcomes: np.ndarray,
    tie_mode: str,
    both_bad: str,
    l2: float,
) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Fit one or many (B x P x 4) outcome tables; return theta, convergence, tie parameter."""
    n_models = len(counts.models)
    wins, losses, ties = _fit_inputs(outcomes, tie_mode, both_bad)
    if tie_mode != "davidson":
        theta, converged = fit_bradley_terry(
            counts.first, counts.second, wins, losses, n_models, l2=l2
        )
        return theta, converged, None
    wins, losses, ties = np.atleast_2d(wins), np.atleast_2d(losses), np.atleast_2d(ties)
    thetas, flags, nus = [], [], []
    for row in range(wins.shape[0]):
        theta, nu, ok = fit_davidson(
            counts.first, counts.second, wins[row], losses[row], ties[row], n_models, l2=l2
        )
        thetas.append(theta)
        flags.append(ok)
        nus.append(nu)
    return np.array(thetas), np.array(flags), float(nus[0])


def bootstrap_outcomes(counts: PairCounts, n_boot: int, seed: int = 0) -> np.ndarray:
    """Return B x P x 4 outcome tables drawn like resampling all battles with replacement."""
    outcomes = counts.outcomes().ravel()
    total = outcomes.sum()
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(int(total), outcomes / total, size=n_boot)
    return draws.reshape(n_boot, -1, 4).astype(float)


def ci_ranks(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Return 1 + the number of models whose lower bound exceeds this model's upper bound."""
    # Chatbot Arena's rank rule (Chiang et al. 2024, section 6; FastChat elo_analysis.py)
    return 1 + (lows[None, :] > highs[:, None]).sum(axis=1)


def leaderboard(
    battles: Iterable[tuple[Hashable, Hashable, str]] | PairCounts,
    *,
    n_boot: int = 100,
    seed: int = 0,
    alpha: float = 0.05,
    ties: str = "half",
    both_bad: str = "exclude",
    scale: float = 400.0,
    base: float = 10.0,
    initial_rating: float = 1000.0,
    anchor: tuple[Hashable, float] | None = None,
    l2: float = 0.0,
) -> Leaderboard:
    """Fit Bradley-Terry ratings with bootstrap CIs and CI-based ranks.

    ``ties``: ``"half"`` counts a tie as half a win each way (Arena), ``"exclude"`` drops ties,
    ``"davidson"`` fits Davidson's (1970) tie model. ``both_bad``: ``"exclude"`` (default) keeps
    both-bad battles out of the fit but in the counts; ``"tie"`` treats them as ties (Arena).
    ``anchor=(model, rating)`` shifts all ratings so that model has that rating.
    """
    if ties not in TIE_MODES:
        raise ValueError(f"ties must be one of {TIE_MODES}")
    if both_bad not in BOTH_BAD_MODES:
        raise ValueError(f"both_bad must be one of {BOTH_BAD_MODES}")
    counts = battles if isinstance(battles, PairCounts) else pair_counts(battles)
    if len(counts.models) < 2:
        raise ValueError("a leaderboard needs battles between at least two models")
    outcomes = counts.outcomes()
    if l2 == 0:
        wins, losses, tie_counts = _fit_inputs(outcomes, ties, both_bad)
        _check_connected(counts, wins + losses + tie_counts)
    theta, converged, tie_parameter = _fit(counts, outcomes, ties, both_bad, l2)
    ratings = _to_rating(theta[0], scale, base, initial_rating)
    replicates = None
    if n_boot > 0:
        boot_theta, _, _ = _fit(
            counts, bootstrap_outcomes(counts, n_boot, seed), ties, both_bad, l2
        )
        replicates = _to_rating(boot_theta, scale, base, initial_rating)
    if anchor is not None:
        model, value = anchor
        position = counts.models.index(model)
        if replicates is not None:
            replicates = replicates + (value - replicates[:, [position]])
        ratings = ratings + (value - ratings[position])
    if replicates is not None:
        lows, highs = np.quantile(replicates, [alpha / 2, 1 - alpha / 2], axis=0)
        ranks = ci_ranks(lows, highs)
    else:
        lows = highs = np.full_like(ratings, np.nan)
        ranks = 1 + (ratings[None, :] > ratings[:, None]).sum(axis=1)
    rows = _rows(counts, ratings, lows, highs, ranks)
    return Leaderboard(
        rows=rows,
        models=list(counts.models),
        ratings=ratings,
        bootstrap=replicates,
        tie_mode=ties,
        tie_parameter=tie_parameter,
        converged=bool(np.all(converged)),
    )


def _rows(counts, ratings, lows, highs, ranks) -> list[ModelRating]:
    """Build leaderboard rows sorted by rating, best first."""
    n_models = len(counts.models)
    wins = np.bincount(counts.first, counts.first_wins, n_models) + np.bincount(
        counts.second, counts.second_wins, n_models
    )
    losses = np.bincount(counts.first, counts.second_wins, n_models) + np.bincount(
        counts.second, counts.first_wins, n_models
    )
    ties = np.bincount(counts.first, counts.ties, n_models) + np.bincount(
        counts.second, counts.ties, n_models
    )
    both_bad = np.bincount(counts.first, counts.both_bad, n_models) + np.bincount(
        counts.second, counts.both_bad, n_models
    )
    order = np.argsort(-ratings, kind="stable")
    return [
        ModelRating(
            model=counts.models[k],
            rating=float(ratings[k]),
            ci_low=float(lows[k]),
            ci_high=float(highs[k]),
            rank=int(ranks[k]),
            wins=int(wins[k]),
            losses=int(losses[k]),
            ties=int(ties[k]),
            both_bad=int(both_bad[k]),
        )
        for k in order
    ]


def online_elo(
    battles: Iterable[tuple[Hashable, Hashable, str]],
    *,
    k: float = 4.0,
    scale: float = 400.0,
    base: float = 10.0,
    initial_rating: float = 1000.0,
) -> dict[Hashable, float]:
    """Return sequential Elo ratings (order matters); ties and both-bad score half a win."""
    ratings: dict[Hashable, float] = {}
    for model_a, model_b, outcome in battles:
        code = OUTCOME_CODES.get(outcome)
        if code is None:
            raise ValueError(f"unknown outcome {outcome!r}")
        ra = ratings.setdefault(model_a, initial_rating)
        rb = ratings.setdefault(model_b, initial_rating)
        # Elo (1978): E_a = 1 / (1 + base^((R_b - R_a) / scale)); R_a += K (S_a - E_a)
        expected_a = 1.0 / (1.0 + base ** ((rb - ra) / scale))
        score_a = {0: 1.0, 1: 0.0}.get(code, 0.5)
        ratings[model_a] = ra + k * (score_a - expected_a)
        ratings[model_b] = rb + k * ((1 - score_a) - (1 - expected_a))
    return ratings
