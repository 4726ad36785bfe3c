"""The demo domain: a true reward that orders answers, disjoint splits, deterministic data."""

import math
import random

import pytest

from training import demo


def test_every_correct_answer_outscores_every_wrong_answer():
    for problem in demo.all_problems():
        rng = random.Random(problem.a * 100 + problem.b)
        correct = [
            demo.true_reward(problem.prompt, demo.render_response(problem, style, problem.answer))
            for style in demo.STYLE_WEIGHTS
        ]
        wrong = [
            demo.true_reward(
                problem.prompt,
                demo.render_response(problem, style, demo.wrong_answer(problem, rng)),
            )
            for style in demo.STYLE_WEIGHTS
        ]
        assert min(correct) > max(wrong), problem


def test_politeness_format_and_length_terms_order_correct_answers():
    prompt = "What is 7 + 5?"
    polite = demo.true_reward(prompt, "Sure! 7 + 5 = 12.")
    equation = demo.true_reward(prompt, "7 + 5 = 12.")
    bare = demo.true_reward(prompt, "The answer is 12.")
    rambling = demo.true_reward(prompt, "Hmm, let me think. Let me think. The answer is 12.")
    rude = demo.true_reward(prompt, "Ugh, obviously 12.")
    assert polite == pytest.approx(1.3)
    assert polite > equation > bare > rambling > rude > 0


def test_missing_wrong_and_hedged_answers_are_penalised():
    prompt = "What is 7 + 5?"
    assert demo.true_reward(prompt, "") == pytest.approx(-1.0)
    assert demo.true_reward(prompt, "The answer is 13.") == pytest.approx(-1.0)
    # The last number is the answer: hedging with another number costs even when it ends right.
    assert demo.true_reward(prompt, "13 or 12.") == pytest.approx(1.0 - 0.3)


def test_true_reward_is_deterministic_and_reads_chat_prompts():
    messages = [{"role": "user", "content": "What is 9 - 4?"}]
    assert demo.true_reward(messages, "9 - 4 = 5.") == demo.true_reward(
        "What is 9 - 4?", "9 - 4 = 5."
    )
    assert demo.true_reward(messages, "9 - 4 = 5.") == pytest.approx(1.1)


def test_splits_are_disjoint_by_operand_pair_and_cover_the_domain():
    train, held_out = demo.problems_in("train"), demo.problems_in("held_out")
    assert {p.pair_key for p in train}.isdisjoint({p.pair_key for p in held_out})
    assert len(train) + len(held_out) == len(demo.all_problems())
    assert 0.1 < len(held_out) / len(demo.all_problems()) < 0.3
    # 7 + 5 and 5 + 7 are one pair: never split across train and held-out.
    for problem in demo.all_problems():
        if problem.op == "+":
            swapped = demo.Problem(problem.b, "+", problem.a)
            assert demo.split_of(problem) == demo.split_of(swapped)


def test_generate_prompts_is_seeded_and_stays_in_its_split():
    first = demo.generate_prompts(300, seed=3, split="held_out")
    assert first == demo.generate_prompts(300, seed=3, split="held_out")
    assert first != demo.generate_prompts(300, seed=4, split="held_out")
    held_out = {p.prompt for p in demo.problems_in("held_out")}
    assert set(first) == held_out  # 300 draws cover every held-out question
    train_prompts = demo.generate_prompts(50, seed=3, split="train")
    assert held_out.isdisjoint(train_prompts)


def test_imperfect_corpus_is_deterministic_often_wrong_and_sometimes_rude():
    rows = demo.imperfect_sft_corpus(2000, seed=1)
    assert rows == demo.imperfect_sft_corpus(2000, seed=1)
    assert all([m["role"] for m in row["messages"]] == ["user", "assistant"] for row in rows)
    held_out = {p.prompt for p in demo.problems_in("held_out")}
    prompts = [row["messages"][0]["content"] for row in rows]
    assert held_out.isdisjoint(prompts)
    answers = [
        (demo.parse_prompt(row["messages"][0]["content"]), row["messages"][1]["content"])
        for row in rows
    ]
    wrong = sum(demo.stated_answer(text) != problem.answer for problem, text in answers)
    rude = sum("Ugh" in text for _, text in answers)
    assert wrong / len(rows) == pytest.approx(0.4, abs=0.04)
    assert rude / len(rows) == pytest.approx(0.25, abs=0.04)


def test_bradley_terry_probability_follows_the_reward_margin():
    prompt = "What is 2 + 2?"
    good, bad = "Sure! 2 + 2 = 4.", "Ugh, obviously 5."
    margin = demo.true_reward(prompt, good) - demo.true_reward(prompt, bad)
    probability = demo.bt_probability(prompt, good, bad, noise=1.0)
    assert probability == pytest.approx(1 / (1 + math.exp(-margin)))
    assert demo.bt_probability(prompt, bad, good, noise=1.0) == pytest.approx(1 - probability)
    assert demo.bt_probability(prompt, good, bad, noise=0) == 1.0


def test_simulated_preference_is_seeded_noisy_and_can_tie():
    prompt = "What is 2 + 2?"
    good, worse = "2 + 2 = 4.", "The answer is 4."  # margin 0.1
    labels = [
        demo.simulated_preference(prompt, good, worse, random.Random(i), 0.1) for i in range(2000)
    ]
    expected = demo.bt_probability(prompt, good, worse, noise=0.1)
    assert labels.count("a") / len(labels) == pytest.approx(expected, abs=0.04)
    again = [
        demo.simulated_preference(prompt, good, worse, random.Random(i), 0.1) for i in range(2000)
    ]
    assert labels == again
    assert (
        demo.simulated_preference(prompt, good, worse, random.Random(0), 0.1, tie_margin=0.2)
        == "tie"
    )
    assert demo.simulated_preference(prompt, worse, good, random.Random(0), 0.0) == "b"
