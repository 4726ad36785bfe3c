"""Calls out of annotation to the apps built on it, which register here when Django starts.

annotation imports none of the other apps (see `.importlinter`), yet a submit must start
quality control: evaluation registers its handler in `EvaluationConfig.ready`, and the
submit calls whatever is registered once its transaction has committed. Likewise simulated
annotators score answers with the true reward of a known task domain (training's demo
registers one in `TrainingConfig.ready`).
"""

from collections.abc import Callable

JudgmentSubmitted = Callable[..., object]

_after_judgment_submitted: list[JudgmentSubmitted] = []

# (prompt, answer) -> score; raises ValueError for a prompt outside its domain
AnswerScorer = Callable[[str, str], float]

_answer_scorers: list[AnswerScorer] = []


def on_judgment_submitted(handler: JudgmentSubmitted) -> JudgmentSubmitted:
    """Register a handler called as handler(project_id=, annotator_id=, judgment_count=)."""
    if handler not in _after_judgment_submitted:
        _after_judgment_submitted.append(handler)
    return handler


def judgment_submitted(*, project_id: int, annotator_id: int, judgment_count: int) -> None:
    """Call every registered handler for a committed judgment."""
    for handler in list(_after_judgment_submitted):
        handler(project_id=project_id, annotator_id=annotator_id, judgment_count=judgment_count)


def on_score_answer(scorer: AnswerScorer) -> AnswerScorer:
    """Register a known domain's true reward for simulated annotators."""
    if scorer not in _answer_scorers:
        _answer_scorers.append(scorer)
    return scorer


def answer_scorers() -> tuple[AnswerScorer, ...]:
    """Return the registered true rewards, in registration order."""
    return tuple(_answer_scorers)
