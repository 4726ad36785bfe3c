"""Bradley-Terry leaderboard checked against choix, Chatbot Arena's fits and hand examples."""

import importlib.util
import math
from collections import Counter
from pathlib import Path

import choix
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.stats.leaderboard import (
    bootstrap_outcomes,
    ci_ranks,
    leaderboard,
    online_elo,
    pair_counts,
)

LN10 = math.log(10)


def to_theta(board, models):
    """Convert Elo-scale ratings back to natural-log strengths in the given model order."""
    ratings = board.as_dict()
    return np.array([(ratings[m] - 1000) * LN10 / 400 for m in models])


def simulate(n_battles, strengths, seed=0, tie_rate=0.0, both_bad_rate=0.0):
    """Return battles drawn from a BT model with some outcome-independent ties and both-bad."""
    rng = np.random.default_rng(seed)
    n_models = len(strengths)
    battles = []
    for _ in range(n_battles):
        i, j = rng.choice(n_models, 2, replace=False)
        u = rng.random()
        decisive = 1 - tie_rate - both_bad_rate
        p_i = 1 / (1 + math.exp(strengths[j] - strengths[i]))
        if u < decisive * p_i:
            outcome = "A"
        elif u < decisive:
            outcome = "B"
        elif u < decisive + tie_rate:
            outcome = "tie"
        else:
            outcome = "both_bad"
        battles.append((f"m{i}", f"m{j}", outcome))
    return battles


def load_bench():
    """Import benchmarks/leaderboard_bench.py, which holds the battle simulator."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "leaderboard_bench.py"
    spec = importlib.util.spec_from_file_location("leaderboard_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arena_mle_elo(model_a, model_b, winner):
    """Fit ratings as Chatbot Arena's notebook did: logistic regression on pivot-table counts."""
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    df = pd.DataFrame({"model_a": model_a, "model_b": model_b, "winner": winner})

    def pivot(frame):
        return pd.pivot_table(
            frame, index="model_a", columns="model_b", aggfunc="size", fill_value=0
        )

    ties = pivot(df[df["winner"].isin(["tie", "tie (bothbad)"])])
    # one decisive vote = two wins, one tie = one win each way
    wins = pivot(df[df["winner"] == "model_a"]) * 2 + pivot(df[df["winner"] == "model_b"]).T * 2
    wins = wins + ties + ties.T
    models = list(wins.index)
    features, labels, weights = [], [], []
    for i, m_a in enumerate(models):
        for j, m_b in enumerate(models):
            if i == j:
                continue
            row = np.zeros(len(models))
            row[i], row[j] = LN10, -LN10
            features += [row, row]
            labels += [1.0, 0.0]
            weights += [wins.loc[m_a, m_b], wins.loc[m_b, m_a]]
    # sklearn >= 1.8 spells "no penalty" as C=inf
    fit = LogisticRegression(fit_intercept=False, C=np.inf, tol=1e-6)
    fit.fit(np.array(features), np.array(labels), sample_weight=weights)
    return dict(zip(models, 400 * fit.coef_[0] + 1000, strict=True))


def arena_bootstrap_bt(model_a, model_b, winner, num_round, seed):
    """Bootstrap as FastChat's compute_bootstrap_bt: multinomial counts, one L-BFGS fit each."""
    from scipy.optimize import minimize
    from scipy.special import expit

    models = list(dict.fromkeys([*model_a, *model_b]))
    index = {m: k for k, m in enumerate(models)}
    score = {"model_a": 2, "model_b": 0}
    rows = [
        (index[a], index[b], score.get(w, 1))
        for a, b, w in zip(model_a, model_b, winner, strict=True)
    ]
    unique, counts = np.unique(np.array(rows), return_counts=True, axis=0)
    matchups, outcomes = unique[:, :2], unique[:, 2] / 2.0

    def loss_and_grad(ratings, weights):
        p = expit(LN10 * (ratings[matchups[:, 0]] - ratings[matchups[:, 1]]))
        loss = -((np.log(p) * outcomes + np.log(1 - p) * (1 - outcomes)) * weights).sum()
        grad = np.zeros_like(ratings)
        np.add.at(grad, matchups, (-LN10 * (outcomes - p) * weights)[:, None] * [1.0, -1.0])
        return loss, grad

    rng = np.random.default_rng(seed)
    draws = rng.multinomial(len(model_a), counts / counts.sum(), size=num_round)
    start = np.zeros(len(models))
    fits = [
        minimize(loss_and_grad, start, (w / len(model_a),), "L-BFGS-B", jac=True).x for w in draws
    ]
    return np.array(fits) * 400 + 1000, models


class TestAgainstChoix:
    @pytest.mark.parametrize(
        ("data", "published"),
        [
            # choix tests/data/testcase-pairwise-{1,2}.json, strengths normalised to sum to 3
            ([[0, 1], [1, 2], [2, 0]], [1.0, 1.0, 1.0]),
            ([[0, 1], [0, 1], [1, 2], [2, 0]], [1.43586088, 0.62035049, 0.94378863]),
        ],
    )
    def test_choix_published_test_cases(self, data, published):
        battles = [(str(winner), str(loser), "A") for winner, loser in data]
        board = leaderboard(battles, n_boot=0)
        strengths = np.exp(to_theta(board, ["0", "1", "2"]))
        assert strengths / strengths.sum() * 3 == pytest.approx(published, abs=1e-6)

    def test_matches_ilsr_and_mm_without_ties(self):
        battles = simulate(4000, np.linspace(-1.5, 1.5, 8), seed=1)
        index = {f"m{k}": k for k in range(8)}
        data = [
            (index[a], index[b]) if outcome == "A" else (index[b], index[a])
            for a, b, outcome in battles
        ]
        theta = to_theta(leaderboard(battles, n_boot=0), list(index))
        assert theta == pytest.approx(choix.ilsr_pairwise(8, data, tol=1e-12), abs=1e-8)
        assert theta == pytest.approx(choix.mm_pairwise(8, data, tol=1e-12), abs=1e-6)

    def test_half_ties_match_choix_on_duplicated_votes(self):
        # Arena's trick: a decisive vote counts twice, a tie once each way.
        battles = simulate(3000, np.linspace(-1, 1, 6), seed=2, tie_rate=0.3)
        index = {f"m{k}": k for k in range(6)}
        data = []
        for a, b, outcome in battles:
            i, j = index[a], index[b]
            if outcome == "A":
                data += [(i, j), (i, j)]
            elif outcome == "B":
                data += [(j, i), (j, i)]
            else:
                data += [(i, j), (j, i)]
        theta = to_theta(leaderboard(battles, n_boot=0, ties="half"), list(index))
        assert theta == pytest.approx(choix.ilsr_pairwise(6, data, tol=1e-12), abs=1e-8)


class TestAgainstArena:
    def test_matches_arena_logistic_regression_within_a_tenth_of_a_point(self):
        pytest.importorskip("sklearn")
        model_a, model_b, winner, _ = load_bench().simulate_battles(60_000, 12, seed=3)
        arena = arena_mle_elo(model_a, model_b, winner)
        ours = leaderboard(
            list(zip(model_a, model_b, winner, strict=True)),
            n_boot=0,
            ties="half",
            both_bad="tie",
        ).as_dict()
        assert max(abs(ours[m] - arena[m]) for m in arena) <= 0.1

    def test_matches_arena_multinomial_bootstrap_spread(self):
        model_a, model_b, winner, _ = load_bench().simulate_battles(30_000, 6, seed=4)
        arena, models = arena_bootstrap_bt(model_a, model_b, winner, 200, seed=5)
        ours = leaderboard(
            pair_counts(model_a=model_a, model_b=model_b, outcome=winner),
            n_boot=200,
            seed=6,
            ties="half",
            both_bad="tie",
        )
        ours_sd = dict(zip(ours.models, ours.bootstrap.std(axis=0), strict=True))
        arena_sd = dict(zip(models, arena.std(axis=0), strict=True))
        for model in models:
            assert ours_sd[model] == pytest.approx(arena_sd[model], rel=0.25)


class TestBootstrap:
    def test_multinomial_draws_keep_the_battle_total_and_mean(self):
        counts = pair_counts(simulate(2000, [0.0, 0.5, 1.0], seed=7, tie_rate=0.2))
        draws = bootstrap_outcomes(counts, 4000, seed=8)
        assert (draws.sum(axis=(1, 2)) == 2000).all()
        assert draws.mean(axis=0) == pytest.approx(counts.outcomes(), rel=0.05, abs=1.0)

    def test_spread_matches_resampling_battles(self):
        # Given a small tournament, when we bootstrap by resampling battle rows explicitly
        battles = simulate(1500, [0.0, 0.4, 0.8, 1.2], seed=9)
        rng = np.random.default_rng(10)
        explicit = []
        for _ in range(300):
            sample = [battles[k] for k in rng.integers(0, len(battles), len(battles))]
            explicit.append(leaderboard(sample, n_boot=0).as_dict())
        board = leaderboard(battles, n_boot=300, seed=11)
        # then the multinomial bootstrap has the same spread
        for k, model in enumerate(board.models):
            explicit_sd = np.std([row[model] for row in explicit])
            assert board.bootstrap[:, k].std() == pytest.approx(explicit_sd, rel=0.2)

    def test_reproducible_with_seed_and_ci_brackets_rating(self):
        battles = simulate(1000, [0.0, 1.0, 2.0], seed=12)
        first = leaderboard(battles, n_boot=50, seed=1)
        second = leaderboard(battles, n_boot=50, seed=1)
        assert np.array_equal(first.bootstrap, second.bootstrap)
        for row in first.rows:
            assert row.ci_low < row.rating < row.ci_high


class TestPreAggregatedRows:
    def test_grouped_rows_with_counts_equal_the_battles(self):
        # Given battles and the same battles grouped by (model_a, model_b, outcome), as SQL
        # GROUP BY returns them, in another row order
        battles = simulate(3000, [0.0, 0.4, 0.9, 1.5], seed=17, tie_rate=0.2, both_bad_rate=0.1)
        grouped = sorted(Counter(battles).items(), key=lambda item: item[1])
        model_a, model_b, outcome = zip(*(key for key, _ in grouped), strict=True)
        count = [n for _, n in grouped]
        models = ["m3", "m2", "m1", "m0"]
        # when both are aggregated
        per_battle = pair_counts(battles, models=models)
        per_group = pair_counts(
            model_a=model_a, model_b=model_b, outcome=outcome, count=count, models=models
        )
        # then the counts, the fit and the bootstrap are the same
        assert per_group.outcomes().tolist() == per_battle.outcomes().tolist()
        assert per_group.n_battles == 3000
        first = leaderboard(per_battle, n_boot=30, seed=3)
        second = leaderboard(per_group, n_boot=30, seed=3)
        assert np.array_equal(first.ratings, second.ratings)
        assert np.array_equal(first.bootstrap, second.bootstrap)
        assert first.rows == second.rows

    @pytest.mark.parametrize("count", [[1, -1], [1, 0.5], [1, float("nan")], [1, 2, 3]])
    def test_bad_counts_are_rejected(self, count):
        with pytest.raises(ValueError, match="count"):
            pair_counts(model_a=["a", "b"], model_b=["b", "a"], outcome=["A", "B"], count=count)


class TestRanks:
    def test_ci_rank_counts_models_that_are_surely_better(self):
        lows = np.array([1100.0, 1090.0, 1000.0, 900.0])
        highs = np.array([1150.0, 1120.0, 1095.0, 980.0])
        # model 2's upper bound 1095 is below model 0's lower bound 1100 only
        assert ci_ranks(lows, highs).tolist() == [1, 1, 2, 4]

    def test_rows_sorted_and_counts_reported(self):
        battles = [("x", "y", "A")] * 30 + [("x", "y", "B")] * 10 + [("y", "x", "tie")] * 4
        battles += [("x", "y", "both_bad")] * 6
        board = leaderboard(battles, n_boot=0)
        x, y = board.rows
        assert x.model == "x" and y.model == "y"
        assert (x.wins, x.losses, x.ties, x.both_bad) == (30, 10, 4, 6)
        assert (y.wins, y.losses, y.n_battles) == (10, 30, 50)
        # half ties: x has 32 of 44 points; rating gap = 400 log10(32 / 12)
        assert x.rating - y.rating == pytest.approx(400 * math.log10(32 / 12))
        assert (x.rating + y.rating) / 2 == pytest.approx(1000)


class TestOptions:
    def test_both_bad_is_excluded_by_default(self):
        battles = simulate(800, [0.0, 0.7, 1.4], seed=13)
        extra = battles + [("m0", "m2", "both_bad")] * 200
        assert leaderboard(extra, n_boot=0).as_dict() == pytest.approx(
            leaderboard(battles, n_boot=0).as_dict()
        )
        as_ties = leaderboard(extra, n_boot=0, both_bad="tie").as_dict()
        assert (
            as_ties["m2"] - as_ties["m0"]
            < leaderboard(battles, n_boot=0).as_dict()["m2"]
            - (leaderboard(battles, n_boot=0).as_dict()["m0"])
        )

    def test_arena_outcome_names_are_accepted(self):
        arena = [("x", "y", "model_a"), ("x", "y", "model_b"), ("x", "y", "tie (bothbad)")]
        ours = [("x", "y", "A"), ("x", "y", "B"), ("x", "y", "both_bad")]
        assert pair_counts(arena).outcomes().tolist() == pair_counts(ours).outcomes().tolist()

    def test_anchor_pins_a_model(self):
        battles = simulate(500, [0.0, 0.5, 1.0], seed=14)
        board = leaderboard(battles, n_boot=20, anchor=("m1", 1114.0))
        assert board.as_dict()["m1"] == pytest.approx(1114.0)
        assert np.allclose(board.bootstrap[:, board.models.index("m1")], 1114.0)

    def test_disconnected_models_need_regularisation(self):
        battles = [("a", "b", "A"), ("b", "a", "A"), ("c", "d", "A"), ("d", "c", "B")]
        with pytest.raises(ValueError, match="never compared"):
            leaderboard(battles, n_boot=0)
        assert np.isfinite(leaderboard(battles, n_boot=0, l2=0.1).ratings).all()

    def test_model_order_can_be_fixed(self):
        counts = pair_counts([("b", "a", "A")], models=["a", "b", "c"])
        assert counts.models == ["a", "b", "c"]
        assert counts.second_wins.tolist() == [1.0, 0.0, 0.0]
        with pytest.raises(ValueError, match="not in models"):
            pair_counts([("a", "z", "A")], models=["a", "b"])

    def test_no_battles_is_rejected(self):
        with pytest.raises(ValueError, match="at least two models"):
            leaderboard([])

    def test_unknown_outcome_is_rejected(self):
        with pytest.raises(ValueError, match="unknown outcome"):
            pair_counts([("a", "b", "draw")])

    def test_davidson_recovers_tie_parameter_and_strengths(self):
        # Davidson (1970): P(i>j) = pi_i / (pi_i + pi_j + nu sqrt(pi_i pi_j))
        rng = np.random.default_rng(15)
        theta = np.array([-0.8, -0.2, 0.3, 0.7])
        nu = 0.8
        battles = []
        for _ in range(40_000):
            i, j = rng.choice(4, 2, replace=False)
            weights = np.array([math.exp(theta[i]), math.exp(theta[j]), 0.0])
            weights[2] = nu * math.sqrt(weights[0] * weights[1])
            outcome = rng.choice(["A", "B", "tie"], p=weights / weights.sum())
            battles.append((f"m{i}", f"m{j}", outcome))
        board = leaderboard(battles, n_boot=0, ties="davidson")
        assert board.tie_parameter == pytest.approx(nu, abs=0.05)
        assert to_theta(board, ["m0", "m1", "m2", "m3"]) == pytest.approx(
            theta - theta.mean(), abs=0.05
        )

    def test_davidson_without_ties_equals_bradley_terry(self):
        battles = simulate(2000, [0.0, 0.5, 1.0], seed=16)
        davidson = leaderboard(battles, n_boot=0, ties="davidson")
        assert davidson.tie_parameter < 1e-3
        assert davidson.as_dict() == pytest.approx(
            leaderboard(battles, n_boot=0).as_dict(), abs=0.5
        )


class TestInvariances:
    @settings(max_examples=40, deadline=None)
    @given(
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from("AB")),
            min_size=1,
            max_size=60,
        ),
        st.randoms(use_true_random=False),
    )
    def test_order_and_side_do_not_matter(self, raw, random):
        battles = [(f"m{i}", f"m{j}", o) for i, j, o in raw if i != j]
        # make the graph strongly connected so the MLE exists
        for i in range(4):
            for j in range(4):
                if i != j:
                    battles.append((f"m{i}", f"m{j}", "A"))
        base = leaderboard(battles, n_boot=0).as_dict()
        mirrored = [(b, a, {"A": "B", "B": "A"}[o]) for a, b, o in battles]
        random.shuffle(mirrored)
        assert leaderboard(mirrored, n_boot=0).as_dict() == pytest.approx(base, abs=1e-8)


def test_online_elo_hand_computed():
    # Elo (1978) update with K = 4: equal ratings, A wins -> +2 / -2; then a tie.
    ratings = online_elo([("x", "y", "A"), ("x", "y", "tie")])
    expected_x = 1002 + 4 * (0.5 - 1 / (1 + 10 ** (-4 / 400)))
    assert ratings["x"] == pytest.approx(expected_x)
    assert ratings["x"] + ratings["y"] == pytest.approx(2000)
