"""Length, distinct-n and repetition on examples worked by hand from the papers' definitions."""

from __future__ import annotations

import pytest

from evaluation.stats.textstats import (
    distinct_n,
    mean_length,
    mean_repetition_rate,
    ngrams,
    repetition_rate,
    text_stats,
)

# Li et al. 2016 count distinct n-grams over all generated responses, scaled by the total
# number of n-grams. Three responses, the first two identical (the "I don't know" failure):
#   "i do not know" (4 words), "i do not know" (4), "i like it" (3)
#   unigrams: 11 in all, distinct {i, do, not, know, like, it} = 6       -> 6/11
#   bigrams:  3 + 3 + 2 = 8, distinct {i do, do not, not know, i like, like it} = 5 -> 5/8
DULL = ["i do not know", "i do not know", "i like it"]


def test_distinct_n_counts_over_the_set_of_answers():
    assert distinct_n(DULL, 1) == pytest.approx(6 / 11)
    assert distinct_n(DULL, 2) == pytest.approx(5 / 8)
    # All different answers: every n-gram distinct.
    assert distinct_n(["a b", "c d"], 1) == 1.0
    assert distinct_n(["a b", "c d"], 2) == 1.0
    # The same answer twice halves distinct-n.
    assert distinct_n(["a b c", "a b c"], 1) == pytest.approx(0.5)


def test_distinct_n_without_any_ngram_is_none():
    assert distinct_n([], 1) is None
    assert distinct_n(["one", ""], 2) is None


def test_seq_rep_n_is_the_share_of_repeated_ngrams_within_an_answer():
    # Welleck et al. 2019 seq-rep-n = 1 - |unique n-grams| / |n-grams| of one continuation.
    # "the cat the cat the cat": six words, three 4-grams
    #   (the cat the cat), (cat the cat the), (the cat the cat): two unique -> 1 - 2/3.
    assert repetition_rate("the cat the cat the cat", 4) == pytest.approx(1 / 3)
    # Bigrams of the same text: the cat, cat the, the cat, cat the, the cat -> 2 unique of 5.
    assert repetition_rate("the cat the cat the cat", 2) == pytest.approx(3 / 5)
    assert repetition_rate("no word repeats here at all", 2) == 0.0
    assert repetition_rate("too short", 4) == 0.0
    assert mean_repetition_rate(["the cat the cat the cat", "no word repeats here"], 4) == (
        pytest.approx((1 / 3 + 0) / 2)
    )


def test_length_counts_whitespace_words_unless_told_otherwise():
    assert mean_length(["a b  c", "d"]) == 2.0
    assert mean_length(["abc", "de"], tokenize=list) == 2.5
    assert mean_length([]) is None
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    with pytest.raises(ValueError):
        ngrams(["a"], 0)


def test_text_stats_collects_every_figure():
    stats = text_stats([*DULL, ""])
    assert stats["n_answers"] == 4
    assert stats["length_unit"] == "whitespace words"
    assert stats["mean_length"] == pytest.approx(11 / 4)
    assert stats["empty_answers"] == 1
    assert stats["distinct_1"] == pytest.approx(6 / 11)
    assert stats["distinct_2"] == pytest.approx(5 / 8)
    # "i do not know" has one 4-gram, unrepeated; the others have none.
    assert stats["repetition"] == 0.0
    assert stats["repetition_n"] == 4
