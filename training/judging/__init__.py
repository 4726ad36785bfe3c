"""Judges that compare model answers: an LLM behind an OpenAI-compatible endpoint.

`training.judging.llm.LLMJudge.compare(prompt, answer_a, answer_b) -> Verdict` is the stable
entry point (both display orders asked; see that module).
"""

from training.judging.llm import (
    DISAGREEMENT_POLICIES,
    Exchange,
    InvalidJudge,
    JudgeError,
    LLMJudge,
    Ranking,
    Verdict,
    parse_verdict,
)

__all__ = [
    "DISAGREEMENT_POLICIES",
    "Exchange",
    "InvalidJudge",
    "JudgeError",
    "LLMJudge",
    "Ranking",
    "Verdict",
    "parse_verdict",
]
