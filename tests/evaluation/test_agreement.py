"""Agreement coefficients checked against published worked examples and reference packages."""

import math

import krippendorff
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.stats.agreement import (
    bootstrap_ci,
    cohen_kappa,
    coincidence_matrix,
    fleiss_kappa,
    kendall_tau_b,
    krippendorff_alpha,
    mean_pairwise_kendall_tau,
    percent_agreement,
    rating_counts,
)

N = None

# Krippendorff (2011) "Computing Krippendorff's Alpha-Reliability", section C: 4 coders x 12 units
# with missing values. Published: nominal .743, ordinal .815, interval .849, ratio .797.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3],
    [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N],
]

# Fleiss' kappa article on Wikipedia: 10 subjects, 14 raters, 5 categories, kappa = 0.210.
WIKIPEDIA_FLEISS = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]

# Fleiss (1971) Table 1: 30 patients, 6 psychiatrists, 5 diagnoses (R irr `diagnoses`),
# published kappa = .430 (irr::kappam.fleiss gives 0.4302445).
FLEISS_1971_DIAGNOSES = [
    [4, 4, 4, 4, 4, 4], [2, 2, 2, 5, 5, 5], [2, 3, 3, 3, 3, 5], [5, 5, 5, 5, 5, 5],
    [2, 2, 2, 4, 4, 4], [1, 1, 3, 3, 3, 3], [3, 3, 3, 3, 5, 5], [1, 1, 3, 3, 3, 4],
    [1, 1, 4, 4, 4, 4], [5, 5, 5, 5, 5, 5], [1, 4, 4, 4, 4, 4], [1, 2, 4, 4, 4, 4],
    [2, 2, 2, 3, 3, 3], [1, 4, 4, 4, 4, 4], [2, 2, 4, 4, 4, 5], [3, 3, 3, 3, 3, 5],
    [1, 1, 1, 4, 5, 5], [1, 1, 1, 1, 1, 2], [2, 2, 4, 4, 4, 4], [1, 3, 3, 5, 5, 5],
    [5, 5, 5, 5, 5, 5], [2, 4, 4, 4, 4, 4], [2, 2, 4, 5, 5, 5], [1, 1, 4, 4, 4, 4],
    [1, 4, 4, 4, 4, 5], [2, 2, 2, 2, 2, 4], [1, 1, 1, 1, 5, 5], [2, 2, 4, 4, 4, 4],
    [1, 3, 3, 3, 3, 3], [5, 5, 5, 5, 5, 5],
]  # fmt: skip


def table_to_labels(table, categories):
    """Expand a rater-A x rater-B contingency table into two label lists."""
    labels_a, labels_b = [], []
    for i, row in enumerate(table):
        for j, count in enumerate(row):
            labels_a += [categories[i]] * count
            labels_b += [categories[j]] * count
    return labels_a, labels_b


class TestKrippendorffAlpha:
    @pytest.mark.parametrize(
        ("level", "published"),
        [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849), ("ratio", 0.797)],
    )
    def test_matches_krippendorff_2011_worked_example(self, level, published):
        alpha = krippendorff_alpha(KRIPPENDORFF_2011, level=level)
        assert alpha == pytest.approx(published, abs=5e-4)

    @pytest.mark.parametrize("level", ["nominal", "ordinal", "interval", "ratio"])
    def test_matches_krippendorff_package_on_worked_example(self, level):
        data = np.array(KRIPPENDORFF_2011, dtype=float)
        expected = krippendorff.alpha(reliability_data=data, level_of_measurement=level)
        assert krippendorff_alpha(data, level=level) == pytest.approx(expected, abs=1e-12)

    def test_nominal_coincidences_match_the_paper(self):
        # Krippendorff (2011) C.4, first coincidence row: 7, 4/3, 1/3, 1/3, 0 (n_1 = 9);
        # by hand: o_11 = 3 (unit 1) + 2 (unit 8) + 2 (unit 11), o_12 = 1 (unit 8) + 1/3 (unit 6).
        values, matrix = coincidence_matrix(KRIPPENDORFF_2011)
        assert values == [1, 2, 3, 4, 5]
        assert matrix[0] == pytest.approx([7, 4 / 3, 1 / 3, 1 / 3, 0])
        assert matrix.sum() == pytest.approx(40)

    def test_string_labels_equal_their_integer_codes(self):
        names = {1: "A", 2: "B", 3: "tie", 4: "both_bad", 5: "skip", N: N}
        as_strings = [[names[v] for v in row] for row in KRIPPENDORFF_2011]
        assert krippendorff_alpha(as_strings) == pytest.approx(
            krippendorff_alpha(KRIPPENDORFF_2011)
        )

    def test_ordinal_on_strings_uses_the_given_category_order(self):
        order = ["bad", "ok", "good", "great", "superb"]
        as_strings = [[v and order[v - 1] for v in row] for row in KRIPPENDORFF_2011]
        alpha = krippendorff_alpha(as_strings, level="ordinal", categories=order)
        assert alpha == pytest.approx(0.815, abs=5e-4)

    def test_nan_marks_missing_like_none(self):
        data = np.array(KRIPPENDORFF_2011, dtype=float)
        assert np.isnan(data).sum() == 7
        assert krippendorff_alpha(data) == pytest.approx(krippendorff_alpha(KRIPPENDORFF_2011))

    def test_no_variation_gives_nan(self):
        assert math.isnan(krippendorff_alpha([[1, 1, 1], [1, 1, N]]))

    def test_unknown_level_is_rejected(self):
        with pytest.raises(ValueError, match="level"):
            krippendorff_alpha(KRIPPENDORFF_2011, level="circular")

    def test_interval_rejects_string_values(self):
        with pytest.raises(ValueError, match="numeric"):
            krippendorff_alpha([["A", "B"], ["A", "A"]], level="interval")

    def test_label_outside_categories_is_rejected(self):
        with pytest.raises(ValueError, match="not among"):
            krippendorff_alpha([["A", "B"], ["A", "C"]], categories=["A", "B"])


@st.composite
def reliability_matrices(draw, min_values=2):
    """Draw a raters x units matrix of small integer codes with some missing cells."""
    n_raters = draw(st.integers(2, 5))
    n_units = draw(st.integers(2, 15))
    cells = st.one_of(st.none(), st.integers(0, 4))
    rows = draw(
        st.lists(
            st.lists(cells, min_size=n_units, max_size=n_units),
            min_size=n_raters,
            max_size=n_raters,
        )
    )
    return rows


def _to_float(rows):
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


class TestKrippendorffAlphaProperties:
    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.integers(0, 4), min_size=2, max_size=20).filter(lambda u: len(set(u)) > 1),
        st.integers(2, 5),
        st.sampled_from(["nominal", "ordinal", "interval", "ratio"]),
    )
    def test_perfect_agreement_with_variation_gives_one(self, unit_values, n_raters, level):
        data = [list(unit_values) for _ in range(n_raters)]
        assert krippendorff_alpha(data, level=level) == pytest.approx(1.0)

    @settings(max_examples=60, deadline=None)
    @given(reliability_matrices(), st.randoms(use_true_random=False))
    def test_invariant_to_permuting_raters_and_units(self, rows, random):
        alpha = krippendorff_alpha(rows, level="interval")
        raters = list(rows)
        random.shuffle(raters)
        order = list(range(len(rows[0])))
        random.shuffle(order)
        shuffled = [[row[i] for i in order] for row in raters]
        other = krippendorff_alpha(shuffled, level="interval")
        if math.isnan(alpha):
            assert math.isnan(other)
        else:
            assert other == pytest.approx(alpha, abs=1e-9)

    @settings(max_examples=80, deadline=None)
    @given(reliability_matrices(), st.sampled_from(["nominal", "ordinal", "interval", "ratio"]))
    def test_agrees_with_krippendorff_package(self, rows, level):
        data = _to_float(rows)
        ours = krippendorff_alpha(data, level=level)
        values = np.unique(data[~np.isnan(data)])
        pairable = (~np.isnan(data)).sum(axis=0) >= 2
        if math.isnan(ours) or values.size < 2 or not pairable.any():
            return
        expected = krippendorff.alpha(reliability_data=data, level_of_measurement=level)
        assert ours == pytest.approx(expected, abs=1e-9)


class TestFleissKappa:
    def test_wikipedia_example(self):
        assert fleiss_kappa(WIKIPEDIA_FLEISS) == pytest.approx(0.210, abs=5e-4)

    def test_fleiss_1971_diagnoses(self):
        _, counts = rating_counts(np.array(FLEISS_1971_DIAGNOSES).T)
        assert counts.shape == (30, 5)
        assert fleiss_kappa(counts) == pytest.approx(0.4302445, abs=1e-7)

    def test_unequal_raters_are_rejected(self):
        with pytest.raises(ValueError, match="same number"):
            fleiss_kappa([[2, 1], [1, 1]])

    def test_perfect_agreement_gives_one(self):
        assert fleiss_kappa([[3, 0], [0, 3], [3, 0]]) == pytest.approx(1.0)


class TestCohenKappa:
    def test_artstein_poesio_2008_dialogue_act_table(self):
        # Artstein & Poesio (2008) section 2.4 table: A_o = 0.88; with Cohen's A_e =
        # (52*46 + 32*44 + 16*10) / 100^2 = 0.396, kappa = (0.88 - 0.396) / 0.604 = 0.80132.
        categories = ["Stat", "IReq", "Chck"]
        table = [[46, 6, 0], [0, 32, 0], [0, 6, 10]]
        coder_b, coder_a = table_to_labels(table, categories)
        assert percent_agreement([coder_a, coder_b]) == pytest.approx(0.88)
        assert cohen_kappa(coder_a, coder_b) == pytest.approx(0.484 / 0.604, abs=1e-12)

    def test_sas_example_unweighted_and_linear(self):
        # SAS PROC FREQ agreement example, reproduced in statsmodels' tests:
        # simple kappa 0.4842, Cicchetti-Allison (linear) weighted kappa 0.4701.
        table = [[0, 4, 1], [0, 8, 0], [0, 1, 5]]
        a, b = table_to_labels(table, [1, 2, 3])
        assert cohen_kappa(a, b) == pytest.approx(0.4842, abs=5e-5)
        assert cohen_kappa(a, b, weights="linear") == pytest.approx(0.4701, abs=5e-5)

    def test_cohen_1968_weighted_example(self):
        # Cohen (1968) example as in psych::cohen.kappa docs: proportions with disagreement
        # weights 1, 3, 6; Cohen reports kappa .492 and weighted kappa .348 (n = 200).
        proportions = np.array([[0.44, 0.07, 0.09], [0.05, 0.20, 0.05], [0.01, 0.03, 0.06]])
        a, b = table_to_labels(np.rint(proportions * 200).astype(int), ["x", "y", "z"])
        weights = [[0, 1, 3], [1, 0, 6], [3, 6, 0]]
        assert cohen_kappa(a, b) == pytest.approx(0.492, abs=5e-4)
        assert cohen_kappa(a, b, weights=weights) == pytest.approx(0.348, abs=5e-4)

    @pytest.mark.parametrize(
        ("weights", "expected"),
        [(None, -0.006289308), ("linear", 0.1459075), ("quadratic", 0.2520325)],
    )
    def test_irr_anxiety_example(self, weights, expected):
        # R irr::kappa2 on anxiety[, 2:3] (unweighted, "equal", "squared"); irr weights the
        # positions of the levels present (1, 2, 3, 4, 6), as we do.
        anxiety = np.array(
            [
                [3, 3, 3, 4, 5, 5, 2, 3, 5, 2, 2, 6, 1, 5, 2, 2, 1, 2, 4, 3],
                [3, 6, 4, 6, 2, 4, 2, 4, 3, 3, 2, 3, 3, 3, 2, 2, 1, 3, 3, 4],
                [2, 1, 4, 4, 3, 2, 1, 6, 1, 1, 1, 2, 3, 3, 1, 1, 3, 3, 2, 2],
            ]
        )
        assert cohen_kappa(anxiety[1], anxiety[2], weights=weights) == pytest.approx(
            expected, abs=1e-7
        )

    def test_matches_sklearn(self):
        sklearn_metrics = pytest.importorskip("sklearn.metrics")
        rng = np.random.default_rng(3)
        a = rng.integers(0, 5, 300)
        b = np.where(rng.random(300) < 0.6, a, rng.integers(0, 5, 300))
        for weights in (None, "linear", "quadratic"):
            expected = sklearn_metrics.cohen_kappa_score(a, b, weights=weights)
            assert cohen_kappa(a, b, weights=weights) == pytest.approx(expected, abs=1e-12)

    def test_missing_pairs_are_dropped(self):
        assert cohen_kappa(["A", "B", None, "A"], ["A", "B", "A", None]) == pytest.approx(1.0)

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.tuples(st.sampled_from(["A", "B", "tie", "both_bad"]), st.sampled_from("AB")),
            min_size=2,
            max_size=40,
        ),
        st.sampled_from([None, "linear", "quadratic"]),
    )
    def test_symmetric_in_the_two_raters(self, pairs, weights):
        a = [p[0] for p in pairs]
        b = [p[1] for p in pairs]
        forward, backward = cohen_kappa(a, b, weights), cohen_kappa(b, a, weights)
        if math.isnan(forward):
            assert math.isnan(backward)
        else:
            assert forward == pytest.approx(backward, abs=1e-12)


class TestKendallTau:
    def test_scipy_docstring_example_with_ties(self):
        # scipy.stats.kendalltau docs: x = [12, 2, 1, 12, 2], y = [1, 4, 7, 1, 0] -> -0.4714045.
        tau = kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0])
        assert tau == pytest.approx(-0.47140452079103173, abs=1e-12)

    def test_hand_counted_example(self):
        # x = 1..5, y = 3,4,1,2,5: pairs (1,3),(1,4),(2,3),(2,4) discordant, 6 concordant,
        # tau = (6 - 4) / 10 = 0.2.
        assert kendall_tau_b([1, 2, 3, 4, 5], [3, 4, 1, 2, 5]) == pytest.approx(0.2)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=2, max_size=25))
    def test_matches_scipy_tau_b(self, pairs):
        x = [p[0] for p in pairs]
        y = [p[1] for p in pairs]
        expected = scipy.stats.kendalltau(x, y, variant="b").statistic
        ours = kendall_tau_b(x, y)
        if math.isnan(expected):
            assert math.isnan(ours)
        else:
            assert ours == pytest.approx(expected, abs=1e-12)

    def test_mean_pairwise_tau_averages_rater_pairs(self):
        item_one = [[1, 2, 3, 4], [1, 2, 3, 4], [4, 3, 2, 1]]  # taus: 1, -1, -1
        item_two = [[1, 2, 3, 4], None, [1, 3, 2, 4]]  # tau: 4/6
        expected = (1 - 1 - 1 + 4 / 6) / 4
        assert mean_pairwise_kendall_tau([item_one, item_two]) == pytest.approx(expected)

    def test_mean_pairwise_tau_matches_scipy(self):
        rng = np.random.default_rng(7)
        items = rng.integers(0, 4, size=(30, 4, 5)).astype(float)
        expected = []
        for item in items:
            for a in range(4):
                for b in range(a + 1, 4):
                    tau = scipy.stats.kendalltau(item[a], item[b]).statistic
                    if not math.isnan(tau):
                        expected.append(tau)
        assert mean_pairwise_kendall_tau(items.tolist()) == pytest.approx(np.mean(expected))


class TestPercentAgreement:
    def test_ties_counted_or_excluded(self):
        data = [
            ["A", "A", "tie", "B"],
            ["A", "B", "tie", "tie"],
            ["A", N, "A", "B"],
        ]
        # counted: unit1 3/3, unit2 0/1, unit3 1/3, unit4 1/3
        assert percent_agreement(data) == pytest.approx((1 + 0 + 1 / 3 + 1 / 3) / 4)
        # excluded: unit1 3/3, unit2 0/1, unit3 has one label left (dropped), unit4 1/1
        assert percent_agreement(data, ties="exclude") == pytest.approx((1 + 0 + 1) / 3)


class TestBootstrapCI:
    def test_interval_brackets_estimate_and_is_reproducible(self):
        data = np.array(KRIPPENDORFF_2011, dtype=float)
        first = bootstrap_ci(krippendorff_alpha, data, n_boot=200, seed=1, axis=1)
        second = bootstrap_ci(krippendorff_alpha, data, n_boot=200, seed=1, axis=1)
        assert first == second
        assert first.low <= first.estimate <= first.high
        assert first.estimate == pytest.approx(0.743, abs=5e-4)

    def test_mean_of_normal_sample_has_textbook_width(self):
        rng = np.random.default_rng(0)
        sample = rng.normal(size=400)
        ci = bootstrap_ci(np.mean, sample, n_boot=2000, seed=0)
        # normal theory: half-width 1.96 * s / sqrt(n)
        half_width = 1.96 * sample.std(ddof=1) / math.sqrt(400)
        assert (ci.high - ci.low) / 2 == pytest.approx(half_width, rel=0.1)
