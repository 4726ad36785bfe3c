"""Calls out of annotation to the apps built on it, which register here when Django starts.

annotation imports none of the other apps (see `.importlinter`), yet a submit must start
quality control: evaluation registers its handler in `EvaluationConfig.ready`, and the
submit calls whatever is registered once its transaction has committed.
"""

from collections.abc import Callable

JudgmentSubmitted = Callable[..., object]

_after_judgment_submitted: list[JudgmentSubmitted] = []


def on_judgment_submitted(handler: JudgmentSubmitted) -> JudgmentSubmitted:
    """Register a handler called as handler(project_id=, annotator_id=, judgment_count=)."""
    if handler not in _after_judgment_submitted:
        _after_judgment_submitted.append(handler)
    return handler


def judgment_submitted(*, project_id: int, annotator_id: int, judgment_count: int) -> None:
    """Call every registered handler for a committed judgment."""
    for handler in list(_after_judgment_submitted):
        handler(project_id=project_id, annotator_id=annotator_id, judgment_count=judgment_count)
