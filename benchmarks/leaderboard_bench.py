"""Time evaluation.leaderboard against a reimplementation of Chatbot Arena's rating code.

Generates battles among models with known Bradley-Terry ratings, then times
  ours:  pair counts -> Newton fit -> multinomial bootstrap, all replicates fitted at once;
  Arena: ``compute_elo_mle_with_tie`` (pandas pivot tables + sklearn LogisticRegression) for the
         point estimate and the multinomial + per-replicate L-BFGS bootstrap
         (``get_bootstrap_result_elo_mle_with_tie`` / ``compute_bootstrap_bt``), reimplemented
         from lm-sys/FastChat ``fastchat/serve/monitor/elo_analysis.py``.
With ``--sklearn-rounds N`` it also times N rounds of Arena's older bootstrap (resample battle
rows, refit with sklearn) and extrapolates them to ``--rounds``.

Run: .venv/bin/python benchmarks/leaderboard_bench.py  (defaults: 1,000,000 battles, 30 models,
100 rounds; about a minute on 2 cores). Needs pandas and scikit-learn (requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation.leaderboard import leaderboard, pair_counts

ARENA_SCALE, ARENA_BASE, ARENA_INIT = 400.0, 10.0, 1000.0


def simulate_battles(
    n_battles: int,
    n_models: int,
    seed: int = 0,
    tie_rate: float = 0.15,
    both_bad_rate: float = 0.05,
):
    """Return a battles DataFrame (model_a, model_b, winner in Arena's vocabulary) and truth."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    true_ratings = 1000 + rng.normal(0, 120, n_models)
    names = np.array([f"model-{k:02d}" for k in range(n_models)], dtype=object)
    a = rng.integers(0, n_models, n_battles)
    b = (a + rng.integers(1, n_models, n_battles)) % n_models
    p_a = 1 / (1 + 10 ** ((true_ratings[b] - true_ratings[a]) / 400))
    u = rng.random(n_battles)
    decisive = 1 - tie_rate - both_bad_rate
    winner = np.where(
        u < decisive * p_a,
        "model_a",
        np.where(
            u < decisive, "model_b", np.where(u < decisive + tie_rate, "tie", "tie (bothbad)")
        ),
    ).astype(object)
    battles = pd.DataFrame({"model_a": names[a], "model_b": names[b], "winner": winner})
    return battles, dict(zip(names, true_ratings, strict=True))


# ---- Arena reimplementation (algorithm of FastChat elo_analysis.py, rewritten here) --------


def arena_compute_mle_elo(df, scale=ARENA_SCALE, base=ARENA_BASE, init=ARENA_INIT, tol=1e-6):
    """Arena's compute_elo_mle_with_tie: weighted logistic regression on pivot-table counts."""
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    def pivot(frame):
        return pd.pivot_table(
            frame, index="model_a", columns="model_b", aggfunc="size", fill_value=0
        )

    a_wins = pivot(df[df["winner"] == "model_a"])
    ties = pivot(df[df["winner"].isin(["tie", "tie (bothbad)"])])
    ties = ties + ties.T
    b_wins = pivot(df[df["winner"] == "model_b"])
    # one decisive vote = two wins, one tie = one win each way
    wins = a_wins * 2 + b_wins.T * 2 + ties
    models = pd.Series(np.arange(len(wins.index)), index=wins.index)
    p = len(models)
    features = np.zeros([p * (p - 1) * 2, p])
    labels = np.zeros(p * (p - 1) * 2)
    weights = []
    row = 0
    for m_a in wins.index:
        for m_b in wins.columns:
            if m_a == m_b:
                continue
            if math.isnan(wins.loc[m_a, m_b]) or math.isnan(wins.loc[m_b, m_a]):
                continue
            features[row, models[m_a]] = math.log(base)
            features[row, models[m_b]] = -math.log(base)
            labels[row] = 1.0
            weights.append(wins.loc[m_a, m_b])
            features[row + 1, models[m_a]] = math.log(base)
            features[row + 1, models[m_b]] = -math.log(base)
            labels[row + 1] = 0.0
            weights.append(wins.loc[m_b, m_a])
            row += 2
    features, labels = features[:row], labels[:row]
    # penalty=None in Arena's code; sklearn >= 1.8 spells "no penalty" as C=inf
    model = LogisticRegression(fit_intercept=False, C=np.inf, tol=tol)
    model.fit(features, labels, sample_weight=weights)
    return pd.Series(scale * model.coef_[0] + init, index=models.index)


def arena_preprocess(df):
    """Arena's preprocess_battles_to_arrays: unique (model_a, model_b, outcome) rows + counts."""
    import pandas as pd

    models = pd.unique(df[["model_a", "model_b"]].values.ravel()).tolist()
    index = {m: k for k, m in enumerate(models)}
    schedule = np.empty((len(df), 3), dtype=np.int32)
    schedule[:, [0, 1]] = df[["model_a", "model_b"]].map(lambda m: index[m]).values
    schedule[:, 2] = np.select(
        [df["winner"] == "model_a", df["winner"] == "model_b"], [2, 0], default=1
    )
    unique_rows, counts = np.unique(schedule, return_counts=True, axis=0)
    return (
        unique_rows[:, :2],
        unique_rows[:, 2].astype(np.float64) / 2.0,
        counts.astype(np.float64),
        models,
    )


def arena_loss_and_grad(ratings, matchups, outcomes, weights, alpha=1.0):
    """Arena's bt_loss_and_grad: weighted BT negative log-likelihood and its gradient."""
    from scipy.special import expit

    pair_ratings = ratings[matchups]
    probs = expit(alpha * (pair_ratings[:, 0] - pair_ratings[:, 1]))
    loss = -((np.log(probs) * outcomes + np.log(1.0 - probs) * (1.0 - outcomes)) * weights).sum()
    pair_grads = -alpha * (outcomes - probs) * weights
    grad = np.zeros_like(ratings)
    np.add.at(grad, matchups[:, [0, 1]], pair_grads[:, None] * np.array([1.0, -1.0]))
    return loss, grad


def arena_fit_bt(matchups, outcomes, weights, n_models, alpha, tol=1e-6):
    """Arena's fit_bt: L-BFGS-B from zero ratings."""
    from scipy.optimize import minimize

    result = minimize(
        fun=arena_loss_and_grad,
        x0=np.zeros(n_models),
        args=(matchups, outcomes, weights, alpha),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 100, "gtol": tol},
    )
    return result["x"]


def arena_bootstrap_bt(df, num_round, processes, seed=0):
    """Arena's multinomial bootstrap: one L-BFGS fit per replicate, in a process pool."""
    matchups, outcomes, weights, models = arena_preprocess(df)
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n=len(df), pvals=weights / weights.sum(), size=num_round)
    boot_weights = draws.astype(np.float64) / len(df)
    fit = partial(arena_fit_bt, matchups, outcomes, n_models=len(models), alpha=np.log(10.0))
    if processes > 1:
        with mp.Pool(processes) as pool:
            results = pool.map(fit, boot_weights)
    else:
        results = [fit(weights) for weights in boot_weights]
    return np.array(results) * ARENA_SCALE + ARENA_INIT, models


def arena_bootstrap_sklearn(df, num_round, seed=0):
    """Arena's older bootstrap: resample battle rows, refit with compute_elo_mle_with_tie."""
    rows = []
    for round_ in range(num_round):
        rows.append(
            arena_compute_mle_elo(df.sample(frac=1.0, replace=True, random_state=seed + round_))
        )
    return rows


# ---- benchmark ---------------------------------------------------------------------------


def pair_counts_of(df):
    """Aggregate a battles DataFrame with evaluation.leaderboard.pair_counts."""
    return pair_counts(
        model_a=df["model_a"].to_numpy(),
        model_b=df["model_b"].to_numpy(),
        outcome=df["winner"].to_numpy(),
    )


def run_ours(df, rounds, seed):
    """Aggregate, fit and bootstrap with evaluation.leaderboard (Arena's tie conventions).

    Return the leaderboard and the seconds spent aggregating and fitting + bootstrapping.
    """
    start = time.perf_counter()
    counts = pair_counts_of(df)
    aggregated = time.perf_counter()
    board = leaderboard(counts, n_boot=rounds, seed=seed, ties="half", both_bad="tie")
    return board, aggregated - start, time.perf_counter() - aggregated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--battles", type=int, default=1_000_000)
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--arena-tol", type=float, default=1e-6)
    parser.add_argument("--sklearn-rounds", type=int, default=0)
    args = parser.parse_args()

    df, truth = simulate_battles(args.battles, args.models, args.seed)
    print(f"{len(df):,} battles among {args.models} models, {args.rounds} bootstrap rounds")

    ours, aggregate_seconds, fit_seconds = run_ours(df, args.rounds, args.seed)
    ours_seconds = aggregate_seconds + fit_seconds

    start = time.perf_counter()
    arena_point = arena_compute_mle_elo(df, tol=args.arena_tol)
    arena_point_seconds = time.perf_counter() - start
    start = time.perf_counter()
    arena_boot, arena_models = arena_bootstrap_bt(df, args.rounds, args.processes, args.seed)
    arena_boot_seconds = time.perf_counter() - start
    arena_seconds = arena_point_seconds + arena_boot_seconds

    ours_ratings = ours.as_dict()
    diff = max(abs(ours_ratings[m] - arena_point[m]) for m in arena_point.index)
    arena_low, arena_high = np.quantile(arena_boot, [0.025, 0.975], axis=0)
    arena_width = dict(zip(arena_models, arena_high - arena_low, strict=True))
    width_ratio = np.median([(r.ci_high - r.ci_low) / arena_width[r.model] for r in ours.rows])
    decisive = leaderboard(pair_counts_of(df), n_boot=0, ties="exclude").as_dict()
    truth_mean = np.mean(list(truth.values()))
    truth_error = max(abs(decisive[m] - (truth[m] - truth_mean + 1000)) for m in truth)

    print(
        f"ours  (aggregate {aggregate_seconds:.3f} s + fit and {args.rounds}-round bootstrap"
        f" {fit_seconds:.3f} s): {ours_seconds:8.3f} s"
    )
    print(
        f"arena (sklearn point {arena_point_seconds:.3f} s + L-BFGS bootstrap "
        f"{arena_boot_seconds:.3f} s on {args.processes} processes): {arena_seconds:8.3f} s"
    )
    print(f"ratio ours / arena: {ours_seconds / arena_seconds:.4f}  (target <= 0.333)")
    print(f"max |ours - arena compute_mle_elo| rating difference: {diff:.4f}  (target <= 0.1)")
    print(f"median CI width ours / arena bootstrap: {width_ratio:.3f}")
    print(f"max |ours on decisive votes - true rating| (mean-centred): {truth_error:.2f}")
    print(f"converged: {ours.converged}")

    if args.sklearn_rounds:
        start = time.perf_counter()
        arena_bootstrap_sklearn(df, args.sklearn_rounds, args.seed)
        per_round = (time.perf_counter() - start) / args.sklearn_rounds
        print(
            f"arena resample-battles sklearn bootstrap: {per_round:.3f} s/round, "
            f"extrapolated to {args.rounds} rounds: {per_round * args.rounds:.1f} s"
        )


if __name__ == "__main__":
    main()
