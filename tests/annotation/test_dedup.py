"""Deduplication at prompt, response and pair level, and MinHash near-duplicate prompts."""

import pytest

from annotation.dedup import DedupTracker, MinHasher, pair_key
from annotation.imports import content_hash


def test_prompt_duplicates_are_found_after_normalising_white_space():
    tracker = DedupTracker()
    assert not tracker.see_prompt(content_hash("What is  2+2?"), "What is  2+2?", "line 1")
    assert tracker.see_prompt(content_hash(" What is 2+2? "), "What is 2+2?", "line 2")
    report = tracker.report()
    assert report["prompt"] == {
        "duplicates": 1,
        "examples": [{"where": "line 2", "prompt": "What is 2+2?"}],
    }


def test_response_duplicates_are_per_prompt():
    tracker = DedupTracker()
    p1, p2 = content_hash("p1"), content_hash("p2")
    answer = content_hash("I don't know.")
    assert not tracker.see_response(p1, answer)
    assert not tracker.see_response(p2, answer)  # the same answer under another prompt
    assert tracker.see_response(p1, answer)
    assert tracker.report()["response"]["duplicates"] == 1


def test_pairs_match_in_either_order():
    p, a, b = content_hash("p"), content_hash("a"), content_hash("b")
    assert pair_key(p, a, b) == pair_key(p, b, a)
    tracker = DedupTracker()
    assert not tracker.see_pair(p, a, b)
    assert tracker.see_pair(p, b, a)
    assert not tracker.see_pair(content_hash("q"), a, b)


def test_examples_are_capped():
    tracker = DedupTracker(examples=2)
    h = content_hash("same")
    for n in range(5):
        tracker.see_prompt(h, "same", f"line {n}")
    report = tracker.report()["prompt"]
    assert report["duplicates"] == 4 and len(report["examples"]) == 2


def test_forget_prompt_scope_keeps_prompt_memory():
    tracker = DedupTracker()
    p, a = content_hash("p"), content_hash("a")
    tracker.see_prompt(p)
    tracker.see_response(p, a)
    tracker.forget_prompt_scope()
    assert not tracker.see_response(p, a)
    assert tracker.see_prompt(p)


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        ("Please explain how photosynthesis turns sunlight water and carbon dioxide "
         "into sugar and oxygen in green plants today", True),
        ("Write a limerick about a cat who learned to play the piano badly at night", False),
    ],
)  # fmt: skip
def test_minhash_finds_near_duplicates_only(other, expected):
    hasher = MinHasher(threshold=0.7)
    base = (
        "Please explain how photosynthesis turns sunlight water and carbon dioxide into "
        "sugar and oxygen in green plants"
    )
    assert hasher.add("first", base) is None
    match = hasher.add("second", other)
    assert (match is not None) == expected
    if expected:
        assert match[0] == "first" and 0.7 <= match[1] <= 1.0


def test_minhash_signatures_are_deterministic_and_ignore_case():
    one, two = MinHasher(), MinHasher()
    text = "The Quick brown fox jumps over the lazy dog"
    assert (one.signature(text) == two.signature(text.lower())).all()
    assert one.signature("   ") is None
