"""An LLM judge labels a project's rounds through the annotation REST API, as source "ai".

The judge works like any annotator (AlpacaFarm's simulated annotators, Dubois et al. 2023, go
through the same interface as people): a machine account in the `prefloop:ai` group asks
`next`, sees only the prompt and the answers in their served order, and submits or skips.
The instruction is the project's rubric as the API serves it. Each pair is asked in both
display orders (`training.judging.llm`); when the orders disagree or a reply has no verdict
the item is labelled a tie or skipped with that reason, as configured. A tie the project does
not offer is skipped. Rankings come from all pairwise comparisons (Copeland score).

A skipped item is not served to the same account again and a submitted one is answered for
good, so a repeat run labels only what is new. If the judge's endpoint fails, the run stops
with `JudgeError` before submitting anything for that item (its lease runs out and the item
goes back to the pool, or to this account's next run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from annotation.simulation import ApiClient, model_judge
from training.judging.llm import LLMJudge, Verdict

MAX_LOST_LEASES = 3
OUTCOME_REASONS = {
    "disagreed": "the two display orders gave different verdicts",
    "unparseable": "a reply had no [[A]]/[[B]]/[[C]] verdict",
}


@dataclass
class LLMAnnotatorStats:
    """What one run did: labels submitted, items skipped and why, and the first error."""

    username: str
    submitted: int = 0
    skipped: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def llm_annotator_username(*, endpoint: str, model: str) -> str:
    """Return the machine account's name for a judge: readable, unique per endpoint and model."""
    tail = re.sub(r"[^A-Za-z0-9_.-]+", "-", model.rstrip("/").rsplit("/", 1)[-1])[:40]
    digest = hashlib.sha256(f"{endpoint}\0{model}".encode()).hexdigest()[:8]
    return f"ai-llm-{endpoint[:40]}-{tail}-{digest}"


@contextlib.contextmanager
def _lease_kept(base_url: str, token: str, payload: dict) -> Iterator[None]:
    """Send heartbeats while the judge thinks, so a slow endpoint does not lose the lease."""
    expires = datetime.fromisoformat(payload["lease_expires"])
    left = (expires - datetime.now(UTC)).total_seconds()
    every = max(1.0, left / 3)
    stop = threading.Event()
    api = ApiClient(base_url, token, retries=1)  # its own session: the main one is busy

    def beat() -> None:
        while not stop.wait(every):
            api.post(f"/api/assignments/{payload['assignment_id']}/heartbeat/")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _decide(judge: LLMJudge, payload: dict, options: dict) -> tuple[dict | None, str, list]:
    """Return (submit body or None to skip, skip reason, verdicts) for a served item."""
    prompt = payload["prompt"].get("messages") or payload["prompt"]["text"]
    texts = [c["text"] for c in payload["candidates"]]
    if options["task_kind"] == "ranking":
        ranking = judge.rank(prompt, texts)
        verdicts = [v for _, _, v in ranking.pairs]
        if judge.on_disagreement == "skip" and ranking.decided_pairs == 0:
            return None, "no pair of answers got a verdict in both orders", verdicts
        # One home for turning scores into ranks, ties shared only where the project allows.
        scores = list(ranking.scores)
        return model_judge(lambda p, a: scores)(payload, options), "", verdicts
    verdict: Verdict = judge.compare(prompt, texts[0], texts[1])
    if verdict.winner is None:
        return None, OUTCOME_REASONS[verdict.outcome], [verdict]
    if verdict.winner == "tie" and "tie" not in options["choices"]:
        reason = "a tie, which this project does not offer"
        if not verdict.decided:
            reason = f"{OUTCOME_REASONS[verdict.outcome]} (a tie, not offered here)"
        return None, reason, [verdict]
    body = {"choice": verdict.winner}
    if options.get("ask_rationale"):
        body["rationale"] = verdict.exchanges[0].reply[:10_000]
    return body, "", [verdict]


def run_llm_annotator(
    *,
    base_url: str,
    token: str,
    project_id: int,
    judge: LLMJudge,
    username: str,
    max_items: int | None = None,
    record: Callable[[dict], None] | None = None,
) -> LLMAnnotatorStats:
    """Label items with the judge until none is left for this account (or max_items).

    `record` receives one plain-JSON audit record per served item: the decision and every
    request and reply of the judge. Raises `JudgeError` when the endpoint fails.
    """
    api = ApiClient(base_url, token)
    stats = LLMAnnotatorStats(username=username)
    got = api.get(f"/api/projects/{project_id}/")
    if got.status_code != 200:
        stats.errors.append(f"project: HTTP {got.status_code}")
        return stats
    project = got.json()
    judge = dataclasses.replace(judge, rubric=project.get("rubric") or "")
    options = {
        "task_kind": project["task_kind"],
        "choices": ["A", "B"] + (["tie"] if project["allow_tie"] else []),
        "allow_tied_ranks": project["allow_tie"],
        "ask_rationale": project.get("ask_rationale", False),
    }
    lost_in_row = 0
    while max_items is None or stats.submitted + stats.skipped < max_items:
        r = api.post(f"/api/projects/{project_id}/next/")
        if r.status_code == 204:
            break
        if r.status_code != 200:
            detail = r.json().get("detail", "") if r.content else ""
            stats.errors.append(f"next: HTTP {r.status_code} {detail}".strip())
            break
        payload = r.json()
        started = time.monotonic()
        with _lease_kept(base_url, token, payload):
            body, reason, verdicts = _decide(judge, payload, options)
        for verdict in verdicts:
            stats.outcomes[verdict.outcome] = stats.outcomes.get(verdict.outcome, 0) + 1
        assignment_id = payload["assignment_id"]
        if body is None:
            s = api.post(
                f"/api/assignments/{assignment_id}/skip/",
                {"reason": f"LLM judge {judge.name}: {reason}"[:500]},
            )
        else:
            # The key is the assignment's: a retried submit returns the first judgment.
            body.update(
                idempotency_key=f"llm-judge-{assignment_id}",
                time_spent_ms=int((time.monotonic() - started) * 1000),
            )
            s = api.post(f"/api/assignments/{assignment_id}/submit/", body)
        if record is not None:
            record(
                {
                    "assignment_id": assignment_id,
                    "judge": judge.describe(),
                    "submitted": body and {k: body[k] for k in ("choice", "ranking") if k in body},
                    "skipped": reason if body is None else "",
                    "http_status": s.status_code,
                    "verdicts": [v.as_dict() for v in verdicts],
                }
            )
        if s.status_code == 409:
            # The lease ran out although heartbeats were sent: ask for the next item, but
            # stop instead of judging lost items over and over.
            lost_in_row += 1
            if lost_in_row >= MAX_LOST_LEASES:
                stats.errors.append(
                    f"{lost_in_row} items in a row were lost before the judge answered "
                    "(HTTP 409); the judge is slower than the project's lease"
                )
                break
            continue
        lost_in_row = 0
        if s.status_code not in (200, 201):
            stats.errors.append(f"{'skip' if body is None else 'submit'}: HTTP {s.status_code}")
            break
        if body is None:
            stats.skipped += 1
        else:
            stats.submitted += 1
    return stats
