"""Pairwise LLM-as-a-judge over an OpenAI-compatible endpoint, with position swap.

The protocol follows the MT-Bench pairwise judge (Zheng et al. 2023, "Judging LLM-as-a-Judge
with MT-Bench and Chatbot Arena", §3 and appendix prompt "pair-v2"): the judge reads the
question and two answers, explains, and ends with "[[A]]", "[[B]]" or "[[C]]" (tie). Judges
favour one display position, so every comparison is asked in BOTH orders (answer 1 first,
then answer 2 first) and counts only when the two replies agree once mapped back to the
original answers ("conservative" swap, §3.3 of the paper). When they disagree, or a reply has
no verdict the parser can read, the comparison is a tie or has no verdict, as configured.

Requests go through the generation client (`training.generation.openai`): the deployment's
declared endpoint by name, its concurrency limit, timeouts and retries with backoff, the key
from the environment variable the endpoint names. Every request body and reply is kept on the
verdict for audit. An endpoint that does not answer, times out or returns something that is
not a chat completion raises `JudgeError`; nothing is decided from a partial answer.

K answers are ranked by all pairwise comparisons (each pair in both orders) and ordered by
Copeland score: pairwise wins minus pairwise losses (Copeland 1951; the "wins" ordering of
pairwise LLM rankers, e.g. Qin et al. 2024 "Large Language Models are Effective Text Rankers
with Pairwise Ranking Prompting").
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from annotation.errors import ServiceError
from training.generation.base import GenerationError, GenerationSettings, Prompt

DISAGREEMENT_POLICIES = ("tie", "skip")

# MT-Bench's verdict markers; C is a tie.
VERDICT_PATTERN = re.compile(r"\[\[\s*([ABC])\s*\]\]")

SYSTEM_PROMPT = (
    "You are an impartial judge. Compare two answers to the user's question and decide which "
    "one follows the instructions and answers better.{rubric} The order of the answers and "
    "their length must not influence you. Explain briefly, then end with your verdict: "
    '"[[A]]" if answer A is better, "[[B]]" if answer B is better, "[[C]]" for a tie.'
)
RUBRIC_CLAUSE = " Judge by these guidelines:\n{rubric}\n"
USER_PROMPT = (
    "[Question]\n{question}\n\n"
    "[Answer A]\n{answer_a}\n[End of answer A]\n\n"
    "[Answer B]\n{answer_b}\n[End of answer B]"
)


class InvalidJudge(ServiceError):
    """A judge setting is out of range; `field` names it."""

    code = "invalid_judge"

    def __init__(self, message: str, *, field: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class JudgeError(GenerationError):
    """The judge's endpoint failed as a whole (down, timed out, garbled); nothing was decided."""


@dataclass(frozen=True)
class Exchange:
    """One request to the judge and its reply, in the order the answers were shown."""

    order: str  # "original": answer_a shown as A; "swapped": answer_b shown as A
    request: dict  # method, path and the exact JSON body sent (never the key)
    reply: str  # the judge's full text
    response: dict  # id, model, finish_reason, usage of the completion
    shown_verdict: str | None  # "A", "B", "tie" as the judge saw the slots; None: unparseable
    verdict: str | None  # the same mapped back to answer_a = "A", answer_b = "B"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one pairwise comparison in both orders.

    ``winner`` is "A" (answer_a), "B" (answer_b), "tie", or None (no verdict: skip it).
    ``outcome`` says why: "agreed" (both orders gave the same verdict), "disagreed" (the orders
    contradict each other: position bias), or "unparseable" (a reply had no verdict marker).
    """

    winner: str | None
    outcome: str
    exchanges: tuple[Exchange, ...]

    @property
    def decided(self) -> bool:
        """Return whether both orders agreed (the winner is the judge's, not the fallback)."""
        return self.outcome == "agreed"

    def as_dict(self) -> dict:
        """Return the verdict and every exchange as plain JSON."""
        return {
            "winner": self.winner,
            "outcome": self.outcome,
            "exchanges": [asdict(e) for e in self.exchanges],
        }


@dataclass(frozen=True)
class Ranking:
    """K answers ranked by pairwise verdicts: ``scores[i]`` = wins - losses of answer i."""

    scores: tuple[int, ...]
    ranks: tuple[int, ...]  # dense ranks from the scores, 1 = best, equal scores share
    pairs: tuple[tuple[int, int, Verdict], ...]  # (i, j, verdict of answer i vs answer j)

    @property
    def decided_pairs(self) -> int:
        return sum(verdict.decided for _, _, verdict in self.pairs)

    def as_dict(self) -> dict:
        return {
            "scores": list(self.scores),
            "ranks": list(self.ranks),
            "pairs": [{"i": i, "j": j, **v.as_dict()} for i, j, v in self.pairs],
        }


def parse_verdict(reply: str) -> str | None:
    """Return "A", "B" or "tie" from the LAST verdict marker of a reply; None if it has none.

    The last marker counts because a judge may quote the format before its own decision.
    """
    found = VERDICT_PATTERN.findall(reply or "")
    if not found:
        return None
    return {"A": "A", "B": "B", "C": "tie"}[found[-1]]


def question_text(prompt: Prompt) -> str:
    """Return a prompt as the text under [Question]: a conversation as a role-tagged transcript."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and prompt[0].get("role") == "user":
        return str(prompt[0].get("content", ""))
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)


def judge_messages(prompt: Prompt, answer_a: str, answer_b: str, *, rubric: str = "") -> list:
    """Return the chat messages asking the judge to compare answer_a (shown A) with answer_b."""
    clause = RUBRIC_CLAUSE.format(rubric=rubric.strip()) if rubric.strip() else ""
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(rubric=clause)},
        {
            "role": "user",
            "content": USER_PROMPT.format(
                question=question_text(prompt), answer_a=answer_a, answer_b=answer_b
            ),
        },
    ]


def _swap(verdict: str | None) -> str | None:
    return {"A": "B", "B": "A"}.get(verdict, verdict)  # type: ignore[arg-type]


def endpoint_judge_backend(*, endpoint: str, model: str):
    """Return the generation client of a declared endpoint and model, its key from the env.

    Raises `InvalidEndpoint` (a 400 naming the field) for an endpoint or model the deployment
    does not declare, and `JudgeError` when the key's environment variable is not set.
    """
    from training.generation.endpoints import generation_backend_for, generation_endpoint_check
    from training.models import ModelVersion

    generation_endpoint_check(endpoint=endpoint, model=model)
    # An unsaved version: the same resolution (endpoint policy, key from the environment)
    # as a registered endpoint policy, with no row written for a judge.
    version = ModelVersion(
        name=f"judge {endpoint}:{model}",
        kind=ModelVersion.Kind.ENDPOINT,
        endpoint_name=endpoint,
        endpoint_model=model,
    )
    try:
        return generation_backend_for(model_version=version)
    except GenerationError as exc:
        raise JudgeError(str(exc)) from exc


@dataclass
class LLMJudge:
    """A pairwise judge behind a declared OpenAI-compatible endpoint.

    Stable interface (the policy evaluation uses it):
    ``compare(prompt, answer_a, answer_b) -> Verdict`` with ``prompt`` a text or chat
    messages; ``compare_many([(prompt, a, b), ...]) -> [Verdict, ...]`` sends all requests
    at once within the endpoint's concurrency limit; ``rank(prompt, answers) -> Ranking``.
    """

    endpoint: str
    model: str
    rubric: str = field(default="", metadata={"help": "Guidelines given to the judge."})
    on_disagreement: str = field(
        default="tie",
        metadata={
            "help": "What a comparison is when the two orders disagree or a reply has no "
            "verdict: a tie, or skipped (winner None).",
            "choices": DISAGREEMENT_POLICIES,
        },
    )
    max_new_tokens: int = field(default=512, metadata={"help": "Longest judge reply in tokens."})
    temperature: float = field(default=0.0, metadata={"help": "0: greedy, as MT-Bench judges."})
    seed: int = field(default=0, metadata={"help": "Base seed of the judge's requests."})
    backend: object = field(default=None, repr=False, metadata={"help": "Resolved client."})

    def __post_init__(self):
        if self.on_disagreement not in DISAGREEMENT_POLICIES:
            raise InvalidJudge(
                f"must be one of {', '.join(DISAGREEMENT_POLICIES)}, not {self.on_disagreement!r}.",
                field="on_disagreement",
            )
        if self.max_new_tokens < 1:
            raise InvalidJudge("must be at least 1.", field="max_new_tokens")
        if self.backend is None:
            self.backend = endpoint_judge_backend(endpoint=self.endpoint, model=self.model)

    @property
    def name(self) -> str:
        """Return how labels and reports name this judge."""
        return f"{self.endpoint}:{self.model}"

    def describe(self) -> dict:
        """Return the judge's settings as plain JSON (for audit records and metadata)."""
        return {
            "judge": "llm-pairwise-position-swap",
            "endpoint": self.endpoint,
            "model": self.model,
            "on_disagreement": self.on_disagreement,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "rubric": self.rubric,
        }

    def compare(self, prompt: Prompt, answer_a: str, answer_b: str) -> Verdict:
        """Return the verdict on answer_a vs answer_b, asked in both display orders."""
        return self.compare_many([(prompt, answer_a, answer_b)])[0]

    def compare_many(
        self,
        comparisons: Sequence[tuple[Prompt, str, str]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[Verdict]:
        """Return a verdict per (prompt, answer_a, answer_b), all requests in one batch."""
        if not comparisons:
            return []
        requests = []
        for prompt, answer_a, answer_b in comparisons:
            requests.append(judge_messages(prompt, answer_a, answer_b, rubric=self.rubric))
            requests.append(judge_messages(prompt, answer_b, answer_a, rubric=self.rubric))
        settings = GenerationSettings(
            temperature=self.temperature,
            top_p=1.0,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
        )
        try:
            replies = self.backend.generate(
                requests, k=1, settings=settings, model_name=self.name, progress=progress
            )
        except JudgeError:
            raise
        except GenerationError as exc:
            raise JudgeError(f"LLM judge {self.name}: {exc}") from exc
        return [
            self._verdict(replies[2 * n][0], replies[2 * n + 1][0]) for n in range(len(comparisons))
        ]

    def rank(self, prompt: Prompt, answers: Sequence[str]) -> Ranking:
        """Rank answers by Copeland score over all pairs, each pair asked in both orders."""
        pairs = list(itertools.combinations(range(len(answers)), 2))
        verdicts = self.compare_many([(prompt, answers[i], answers[j]) for i, j in pairs])
        scores = [0] * len(answers)
        for (i, j), verdict in zip(pairs, verdicts, strict=True):
            if verdict.winner == "A":
                scores[i] += 1
                scores[j] -= 1
            elif verdict.winner == "B":
                scores[j] += 1
                scores[i] -= 1
        distinct = sorted(set(scores), reverse=True)
        return Ranking(
            scores=tuple(scores),
            ranks=tuple(distinct.index(s) + 1 for s in scores),
            pairs=tuple((i, j, v) for (i, j), v in zip(pairs, verdicts, strict=True)),
        )

    def _exchange(self, candidate: dict, order: str) -> Exchange:
        config = candidate["generation_config"]
        shown = parse_verdict(candidate["text"])
        return Exchange(
            order=order,
            request=config["request"],
            reply=candidate["text"],
            response=config.get("response", {}),
            shown_verdict=shown,
            verdict=shown if order == "original" else _swap(shown),
        )

    def _verdict(self, original: dict, swapped: dict) -> Verdict:
        exchanges = (self._exchange(original, "original"), self._exchange(swapped, "swapped"))
        first, second = (e.verdict for e in exchanges)
        if first is None or second is None:
            outcome = "unparseable"
        elif first == second:
            return Verdict(winner=first, outcome="agreed", exchanges=exchanges)
        else:
            outcome = "disagreed"
        winner = "tie" if self.on_disagreement == "tie" else None
        return Verdict(winner=winner, outcome=outcome, exchanges=exchanges)
