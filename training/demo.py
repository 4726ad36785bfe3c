"""The built-in demo domain: one-digit arithmetic whose true preference can be computed.

A prompt asks "What is 7 + 5?". A good answer is correct, polite and short ("Sure! 7 + 5 =
12."). ``true_reward`` scores any answer deterministically, so simulated annotators
(``simulated_preference``) can label pairs and every trained policy can be scored exactly.
``imperfect_sft_corpus`` gives demonstrations that are often wrong or rude, so a tiny policy
trained on them by SFT leaves room for preference training to improve it.

Train and held-out prompts are disjoint by operand pair: ``7 + 5`` and ``5 + 7`` are the same
pair and always land in the same split. The vocabulary is a few dozen words, small enough for
a GPT-2 of about a million parameters to learn in a minute or two on a CPU.

No Django here: this module is imported by training workers and benchmarks.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "held_out"]
Choice = Literal["a", "b", "tie"]

OPERATIONS = ("+", "-")
MAX_OPERAND = 9
HELD_OUT_FRACTION = 0.2
# Fixed, never a run's seed: every run and every process must agree on the split.
SPLIT_SEED = 20_251_130

PROMPT_TEMPLATE = "What is {a} {op} {b}?"
PROMPT_PATTERN = re.compile(r"What is (\d+) ([+-]) (\d+)\?")
NUMBER_PATTERN = re.compile(r"-?\d+")

POLITE_OPENERS = ("Sure!", "Happy to help!")
RUDE_WORDS = ("ugh", "obviously", "dumb")

# The reward's terms. Correctness dominates: a wrong answer never outscores a right one.
CORRECT_REWARD = 1.0
WRONG_REWARD = -1.0
POLITE_BONUS = 0.2
RUDE_PENALTY = 0.5
EQUATION_BONUS = 0.1
EXTRA_NUMBER_PENALTY = 0.3
WORD_BUDGET = 8
PER_EXTRA_WORD_PENALTY = 0.05
MAX_LENGTH_PENALTY = 0.5

# Styles of demonstration and their shares in the imperfect SFT corpus.
STYLE_WEIGHTS = {
    "polite": 0.15,  # Sure! 7 + 5 = 12.
    "equation": 0.25,  # 7 + 5 = 12.
    "answer": 0.25,  # The answer is 12.
    "rude": 0.25,  # Ugh, obviously 12.
    "rambling": 0.10,  # Hmm, let me think. Let me think. The answer is 12.
}
WRONG_FRACTION = 0.4


@dataclass(frozen=True)
class Problem:
    """One arithmetic question."""

    a: int
    op: str
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(a=self.a, op=self.op, b=self.b)

    @property
    def equation(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def pair_key(self) -> tuple[str, int, int]:
        """Return the key that decides the split: addition is unordered, subtraction ordered."""
        if self.op == "+":
            return (self.op, min(self.a, self.b), max(self.a, self.b))
        return (self.op, self.a, self.b)


def all_problems() -> list[Problem]:
    """Return every question of the domain; subtraction never goes below zero."""
    problems = []
    for op in OPERATIONS:
        for a in range(MAX_OPERAND + 1):
            for b in range(MAX_OPERAND + 1):
                if op == "-" and b > a:
                    continue
                problems.append(Problem(a, op, b))
    return problems


def _held_out_keys() -> frozenset[tuple[str, int, int]]:
    keys = sorted({problem.pair_key for problem in all_problems()})
    random.Random(SPLIT_SEED).shuffle(keys)
    return frozenset(keys[: round(len(keys) * HELD_OUT_FRACTION)])


_HELD_OUT_KEYS = _held_out_keys()


def split_of(problem: Problem) -> Split:
    """Return the split a question belongs to (fixed for the domain, not per run)."""
    return "held_out" if problem.pair_key in _HELD_OUT_KEYS else "train"


def problems_in(split: Split) -> list[Problem]:
    """Return the questions of one split, in a fixed order."""
    if split not in ("train", "held_out"):
        raise ValueError(f"unknown split {split!r}: use 'train' or 'held_out'")
    return [problem for problem in all_problems() if split_of(problem) == split]


def parse_prompt(prompt: str | list[dict]) -> Problem:
    """Return the question asked by a prompt (a string or chat messages)."""
    if isinstance(prompt, list):
        prompt = next(m["content"] for m in reversed(prompt) if m.get("role") == "user")
    match = PROMPT_PATTERN.search(prompt)
    if match is None:
        raise ValueError(f"not a demo prompt: {prompt!r}")
    return Problem(int(match.group(1)), match.group(2), int(match.group(3)))


def generate_prompts(n: int, seed: int, split: Split = "train") -> list[str]:
    """Return ``n`` prompts drawn from ``split``: every question once per round, shuffled."""
    pool = problems_in(split)
    rng = random.Random(seed)
    prompts: list[str] = []
    while len(prompts) < n:
        round_ = pool[:]
        rng.shuffle(round_)
        prompts.extend(problem.prompt for problem in round_[: n - len(prompts)])
    return prompts


def stated_answer(response: str) -> int | None:
    """Return the answer a response commits to: its last number, or None."""
    numbers = NUMBER_PATTERN.findall(response)
    return int(numbers[-1]) if numbers else None


def true_reward(prompt: str | list[dict], response: str) -> float:
    """Return the demo domain's true reward of ``response`` to ``prompt``.

    Terms: +1 for a correct final answer, -1 for a wrong or missing one; +0.2 for a polite
    opener; -0.5 for rude words; +0.1 for restating the equation ("7 + 5 = 12"); -0.3 when the
    response names other numbers than the operands, the right answer and its own final answer
    (hedging); -0.05 per word beyond eight, at most -0.5 (rambling). A right answer always
    outscores a wrong one.
    """
    problem = parse_prompt(prompt)
    text = response.strip()
    answer = stated_answer(text)
    reward = CORRECT_REWARD if answer == problem.answer else WRONG_REWARD

    if text.startswith(POLITE_OPENERS):
        reward += POLITE_BONUS
    words = re.findall(r"[a-z]+", text.lower())
    if any(word in RUDE_WORDS for word in words):
        reward -= RUDE_PENALTY
    if f"{problem.equation} = {problem.answer}" in text:
        reward += EQUATION_BONUS
    allowed = {problem.a, problem.b, problem.answer, answer}
    if any(int(number) not in allowed for number in NUMBER_PATTERN.findall(text)):
        reward -= EXTRA_NUMBER_PENALTY
    extra_words = max(0, len(text.split()) - WORD_BUDGET)
    reward -= min(MAX_LENGTH_PENALTY, PER_EXTRA_WORD_PENALTY * extra_words)
    return round(reward, 6)


def render_response(problem: Problem, style: str, answer: int) -> str:
    """Return a response to ``problem`` in ``style`` that states ``answer``."""
    if style == "polite":
        return f"Sure! {problem.equation} = {answer}."
    if style == "equation":
        return f"{problem.equation} = {answer}."
    if style == "answer":
        return f"The answer is {answer}."
    if style == "rude":
        return f"Ugh, obviously {answer}."
    if style == "rambling":
        return f"Hmm, let me think. Let me think. The answer is {answer}."
    raise ValueError(f"unknown style {style!r}")


def wrong_answer(problem: Problem, rng: random.Random) -> int:
    """Return a plausible wrong answer: off by one to three, never negative."""
    offsets = [d for d in (-3, -2, -1, 1, 2, 3) if problem.answer + d >= 0]
    return problem.answer + rng.choice(offsets)


def sample_response(
    problem: Problem,
    rng: random.Random,
    *,
    wrong_fraction: float = WRONG_FRACTION,
    style_weights: dict[str, float] | None = None,
) -> str:
    """Return one response drawn from the imperfect demonstrator's distribution."""
    weights = style_weights or STYLE_WEIGHTS
    style = rng.choices(list(weights), weights=list(weights.values()))[0]
    answer = wrong_answer(problem, rng) if rng.random() < wrong_fraction else problem.answer
    return render_response(problem, style, answer)


def imperfect_sft_corpus(
    n: int, seed: int, *, wrong_fraction: float = WRONG_FRACTION
) -> list[dict]:
    """Return ``n`` chat demonstrations on train prompts, often wrong (40%) or rude (25%).

    Each row is ``{"messages": [user, assistant]}``, the conversational format TRL's SFT takes.
    """
    rng = random.Random(seed)
    prompts = generate_prompts(n, seed, "train")
    rows = []
    for prompt in prompts:
        response = sample_response(parse_prompt(prompt), rng, wrong_fraction=wrong_fraction)
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": response},
                ]
            }
        )
    return rows


def tokenizer_training_texts() -> list[str]:
    """Return texts covering the whole demo vocabulary, to train a tokenizer on."""
    rng = random.Random(0)
    texts = []
    for problem in all_problems():
        texts.append(problem.prompt)
        for style in STYLE_WEIGHTS:
            texts.append(render_response(problem, style, problem.answer))
            texts.append(render_response(problem, style, wrong_answer(problem, rng)))
    return texts


def polite_only_reward(prompt: str | list[dict], response: str) -> float:
    """Return 1 for an answer with a polite opener and 0 otherwise, whatever its number says.

    A deliberately hackable labelling preference (``manage.py demo --labels polite_only``):
    a reward model trained on it learns style and nothing about arithmetic.
    """
    parse_prompt(prompt)  # a demo prompt, as the true reward requires
    return 1.0 if response.strip().startswith(POLITE_OPENERS) else 0.0


LABEL_PREFERENCES = {"true": true_reward, "polite_only": polite_only_reward}


def bt_probability(
    prompt: str | list[dict], response_a: str, response_b: str, *, noise: float = 0.5
) -> float:
    """Return P(a preferred to b) under Bradley-Terry on the true reward, temperature ``noise``.

    ``noise`` = 0 gives a perfect annotator (probability 0, 0.5 or 1).
    """
    # Bradley-Terry: P(a > b) = sigmoid((r_a - r_b) / T) (Bradley & Terry 1952; Ouyang 2022 §3.5)
    margin = true_reward(prompt, response_a) - true_reward(prompt, response_b)
    if noise <= 0:
        return 1.0 if margin > 0 else 0.0 if margin < 0 else 0.5
    return 1.0 / (1.0 + math.exp(-margin / noise))


def simulated_preference(
    prompt: str | list[dict],
    response_a: str,
    response_b: str,
    rng: random.Random,
    noise: float = 0.5,
    *,
    tie_margin: float = 0.0,
) -> Choice:
    """Return a simulated annotator's label for a pair: "a", "b" or "tie".

    The annotator says "tie" when the true rewards differ by less than ``tie_margin`` (0:
    never), else draws its choice from ``bt_probability``.
    """
    margin = abs(true_reward(prompt, response_a) - true_reward(prompt, response_b))
    if tie_margin > 0 and margin < tie_margin:
        return "tie"
    probability_a = bt_probability(prompt, response_a, response_b, noise=noise)
    return "a" if rng.random() < probability_a else "b"
