"""Text statistics of a set of model answers: length, distinct-n and repetition (no Django).

Lengths and n-grams count whitespace-separated words (``str.split()``), not model tokens, so
figures of policies with different tokenizers compare; pass ``tokenize`` to count otherwise.
These are the one home of these figures: the loop's evaluation stores them per policy and the
reward-hacking guards read them from there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

Tokenize = Callable[[str], list[str]]


def words(text: str) -> list[str]:
    """Return the whitespace-separated words of a text."""
    return text.split()


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """Return the n-grams of a token sequence, in order (none when it is shorter than n)."""
    if n < 1:
        raise ValueError("n must be at least 1")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def mean_length(texts: Sequence[str], *, tokenize: Tokenize = words) -> float | None:
    """Return the mean number of tokens per answer (None for no answers)."""
    if not texts:
        return None
    return float(np.mean([len(tokenize(t)) for t in texts]))


def distinct_n(texts: Sequence[str], n: int, *, tokenize: Tokenize = words) -> float | None:
    """Return distinct n-grams / all n-grams over the whole set of answers.

    Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models"
    §4.2 (distinct-1, distinct-2). None when the answers hold no n-gram at all.
    """
    grams: list[tuple[str, ...]] = []
    for text in texts:
        grams.extend(ngrams(tokenize(text), n))
    if not grams:
        return None
    return len(set(grams)) / len(grams)


def repetition_rate(text: str, n: int, *, tokenize: Tokenize = words) -> float:
    """Return the share of an answer's n-grams that repeat an earlier one: 1 - unique / total.

    Welleck et al. 2019, "Neural Text Generation with Unlikelihood Training" §5 (seq-rep-n).
    An answer shorter than n has no n-gram and so no repetition (0).
    """
    grams = ngrams(tokenize(text), n)
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def mean_repetition_rate(
    texts: Sequence[str], n: int = 4, *, tokenize: Tokenize = words
) -> float | None:
    """Return seq-rep-n averaged over answers (None for no answers)."""
    if not texts:
        return None
    return float(np.mean([repetition_rate(t, n, tokenize=tokenize) for t in texts]))


def text_stats(texts: Sequence[str], *, tokenize: Tokenize = words, rep_n: int = 4) -> dict:
    """Return length, distinct-1/2 and repetition of a set of answers as one record."""
    counts = Counter(len(tokenize(t)) for t in texts)
    return {
        "n_answers": len(texts),
        "length_unit": "whitespace words" if tokenize is words else "tokens",
        "mean_length": mean_length(texts, tokenize=tokenize),
        "empty_answers": counts.get(0, 0),
        "distinct_1": distinct_n(texts, 1, tokenize=tokenize),
        "distinct_2": distinct_n(texts, 2, tokenize=tokenize),
        "repetition": mean_repetition_rate(texts, rep_n, tokenize=tokenize),
        "repetition_n": rep_n,
    }
