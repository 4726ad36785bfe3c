"""Label aggregation: majority, trust-weighted vote and Dawid-Skene against the 1979 paper."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.stats.aggregation import (
    dawid_skene,
    label_accuracy,
    majority_vote,
    soft_label,
    weighted_vote,
)

# Dawid & Skene (1979) Table 1: 45 patients, 5 anaesthetists, 4 classes; observer 1 rated each
# patient three times. Transcribed as {patient: {observer: [responses]}}.
DAWID_SKENE_1979 = {
    1: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    2: {1: [3, 3, 3], 2: [4], 3: [3], 4: [3], 5: [4]},
    3: {1: [1, 1, 2], 2: [2], 3: [1], 4: [2], 5: [2]},
    4: {1: [2, 2, 2], 2: [3], 3: [1], 4: [2], 5: [1]},
    5: {1: [2, 2, 2], 2: [3], 3: [2], 4: [2], 5: [2]},
    6: {1: [2, 2, 2], 2: [3], 3: [3], 4: [2], 5: [2]},
    7: {1: [1, 2, 2], 2: [2], 3: [1], 4: [1], 5: [1]},
    8: {1: [3, 3, 3], 2: [3], 3: [4], 4: [3], 5: [3]},
    9: {1: [2, 2, 2], 2: [2], 3: [2], 4: [2], 5: [3]},
    10: {1: [2, 3, 2], 2: [2], 3: [2], 4: [2], 5: [3]},
    11: {1: [4, 4, 4], 2: [4], 3: [4], 4: [4], 5: [4]},
    12: {1: [2, 2, 2], 2: [3], 3: [3], 4: [4], 5: [3]},
    13: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    14: {1: [2, 2, 2], 2: [3], 3: [2], 4: [1], 5: [2]},
    15: {1: [1, 2, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    16: {1: [1, 1, 1], 2: [2], 3: [1], 4: [1], 5: [1]},
    17: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    18: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    19: {1: [2, 2, 2], 2: [2], 3: [2], 4: [2], 5: [1]},
    20: {1: [2, 2, 2], 2: [1], 3: [3], 4: [2], 5: [2]},
    21: {1: [2, 2, 2], 2: [2], 3: [2], 4: [2], 5: [2]},
    22: {1: [2, 2, 2], 2: [2], 3: [2], 4: [2], 5: [1]},
    23: {1: [2, 2, 2], 2: [3], 3: [2], 4: [2], 5: [2]},
    24: {1: [2, 2, 1], 2: [2], 3: [2], 4: [2], 5: [2]},
    25: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    26: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    27: {1: [2, 3, 2], 2: [2], 3: [2], 4: [2], 5: [2]},
    28: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    29: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    30: {1: [1, 1, 2], 2: [1], 3: [1], 4: [2], 5: [1]},
    31: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    32: {1: [3, 3, 3], 2: [3], 3: [2], 4: [3], 5: [3]},
    33: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    34: {1: [2, 2, 2], 2: [2], 3: [2], 4: [2], 5: [2]},
    35: {1: [2, 2, 2], 2: [3], 3: [2], 4: [3], 5: [2]},
    36: {1: [4, 3, 3], 2: [4], 3: [3], 4: [4], 5: [3]},
    37: {1: [2, 2, 1], 2: [2], 3: [2], 4: [3], 5: [2]},
    38: {1: [2, 3, 2], 2: [3], 3: [2], 4: [3], 5: [3]},
    39: {1: [3, 3, 3], 2: [3], 3: [4], 4: [3], 5: [2]},
    40: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    41: {1: [1, 1, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    42: {1: [1, 2, 1], 2: [2], 3: [1], 4: [1], 5: [1]},
    43: {1: [2, 3, 2], 2: [2], 3: [2], 4: [2], 5: [2]},
    44: {1: [1, 2, 1], 2: [1], 3: [1], 4: [1], 5: [1]},
    45: {1: [2, 2, 2], 2: [2], 3: [2], 4: [2], 5: [2]},
}

# Dawid & Skene (1979) Table 2, estimated error rates pi^k_jl (rows: true class j, columns:
# response l), to two decimals.
PUBLISHED_ERROR_RATES = {
    1: [[0.89, 0.11, 0, 0], [0.07, 0.88, 0.05, 0], [0, 0.34, 0.66, 0], [0, 0, 0.56, 0.44]],
    2: [[0.83, 0.17, 0, 0], [0.05, 0.63, 0.31, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
    3: [[1, 0, 0, 0], [0.11, 0.79, 0.11, 0], [0, 0.40, 0.20, 0.40], [0, 0, 0.67, 0.33]],
    4: [[0.94, 0.06, 0, 0], [0.05, 0.84, 0.10, 0], [0, 0, 0.80, 0.20], [0, 0, 0.33, 0.67]],
    5: [[1, 0, 0, 0], [0.16, 0.73, 0.11, 0], [0, 0.21, 0.79, 0], [0, 0, 0.33, 0.67]],
}


def paper_judgments():
    return [
        (patient, observer, label)
        for patient, observers in DAWID_SKENE_1979.items()
        for observer, labels in observers.items()
        for label in labels
    ]


class TestDawidSkenePaper:
    @pytest.fixture(scope="class")
    def fit(self):
        return dawid_skene(paper_judgments(), smoothing=0.0, tol=1e-12, max_iter=1000)

    def test_converges(self, fit):
        assert fit.converged

    def test_class_marginals_match_paper(self, fit):
        # Dawid & Skene (1979) section 4: p = (0.40, 0.42, 0.11, 0.07)
        priors = [fit.class_priors[k] for k in (1, 2, 3, 4)]
        assert priors == pytest.approx([0.40, 0.42, 0.11, 0.07], abs=0.005)

    @pytest.mark.parametrize("observer", [1, 2, 3, 4, 5])
    def test_error_rates_match_table_2(self, fit, observer):
        assert fit.confusion[observer] == pytest.approx(
            np.array(PUBLISHED_ERROR_RATES[observer]), abs=0.005
        )

    def test_patient_classes_match_paper(self, fit):
        # Paper's Table 4: patient 2 is class 4 despite four "3" votes; patient 7 is class 1
        # with probability 0.98; patient 36 is class 4.
        assert fit.labels[2].label == 4
        assert fit.labels[2].confidence == pytest.approx(1.0, abs=0.005)
        assert fit.labels[7].label == 1
        assert fit.labels[7].confidence == pytest.approx(0.98, abs=0.005)
        assert fit.labels[36].label == 4

    def test_repeated_labels_by_one_observer_are_counted(self, fit):
        assert fit.labels[1].n_votes == 7


class TestDawidSkeneSynthetic:
    def test_beats_majority_when_spammers_outnumber_experts(self):
        # Given two 90%-accurate annotators and three spammers who always answer "A"
        rng = np.random.default_rng(0)
        truth = {item: rng.choice(["A", "B"]) for item in range(400)}
        judgments = []
        for item, label in truth.items():
            for expert in ("e1", "e2"):
                flip = rng.random() < 0.1
                judgments.append((item, expert, ("B" if label == "A" else "A") if flip else label))
            for spammer in ("s1", "s2", "s3"):
                judgments.append((item, spammer, "A"))
        # When aggregated
        majority = majority_vote(judgments)
        fitted = dawid_skene(judgments)
        # Then majority is at chance and Dawid-Skene recovers the experts' labels
        assert label_accuracy(majority, truth) < 0.6
        assert label_accuracy(fitted.labels, truth) > 0.85
        assert fitted.confusion["s1"][:, 0] == pytest.approx([1.0, 1.0], abs=0.01)

    def test_tie_and_both_bad_stay_their_own_classes(self):
        judgments = [
            (1, "x", "tie"), (1, "y", "tie"), (1, "z", "A"),
            (2, "x", "both_bad"), (2, "y", "both_bad"), (2, "z", "both_bad"),
            (3, "x", "B"), (3, "y", "B"), (3, "z", "B"),
        ]  # fmt: skip
        fitted = dawid_skene(judgments)
        assert set(fitted.classes) == {"A", "B", "tie", "both_bad"}
        assert fitted.labels[2].label == "both_bad"
        assert fitted.labels[2].soft_label is None
        assert fitted.labels[3].label == "B"


class TestMajorityVote:
    def test_plurality_confidence_and_soft_label(self):
        judgments = [(1, "x", "A"), (1, "y", "A"), (1, "z", "tie"), (1, "w", "B")]
        result = majority_vote(judgments)[1]
        assert result.label == "A"
        assert result.confidence == pytest.approx(0.5)
        # (A + tie/2) / (A + B + tie) = (2 + 0.5) / 4
        assert result.soft_label == pytest.approx(0.625)
        assert result.n_votes == 4

    def test_even_split_becomes_tie_and_is_flagged(self):
        result = majority_vote([(1, "x", "A"), (1, "y", "B")])[1]
        assert result.label == "tie"
        assert result.split
        assert result.soft_label == pytest.approx(0.5)

    def test_both_bad_is_an_outcome_and_not_in_the_soft_label(self):
        judgments = [(1, "x", "both_bad"), (1, "y", "both_bad"), (1, "z", "A")]
        result = majority_vote(judgments)[1]
        assert result.label == "both_bad"
        assert result.soft_label == pytest.approx(1.0)


class TestWeightedVote:
    def test_trusted_annotator_outweighs_two_others(self):
        judgments = [(1, "gold", "B"), (1, "x", "A"), (1, "y", "A")]
        result = weighted_vote(judgments, {"gold": 0.95, "x": 0.4, "y": 0.4})[1]
        assert result.label == "B"
        assert result.confidence == pytest.approx(0.95 / 1.75)
        assert result.soft_label == pytest.approx(0.8 / 1.75)

    def test_unknown_annotators_get_the_default_weight(self):
        judgments = [(1, "known", "B"), (1, "new", "A")]
        assert weighted_vote(judgments, {"known": 2.0}, default_weight=1.0)[1].label == "B"
        assert weighted_vote(judgments, {"known": 0.5}, default_weight=1.0)[1].label == "A"

    def test_negative_weight_is_rejected(self):
        with pytest.raises(ValueError, match="negative"):
            weighted_vote([(1, "x", "A")], {"x": -1})

    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.sampled_from(["A", "B", "tie", "both_bad"]), min_size=1, max_size=12))
    def test_equal_weights_equal_majority(self, labels):
        judgments = [(0, f"r{i}", label) for i, label in enumerate(labels)]
        assert weighted_vote(judgments, {}, default_weight=3.0) == majority_vote(judgments)


def test_soft_label_without_preference_votes_is_none():
    assert soft_label({"both_bad": 3}) is None
    assert soft_label({"A": 1, "B": 1, "tie": 2}) == pytest.approx(0.5)
