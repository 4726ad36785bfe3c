"""Simulated annotators that drive the real REST API over HTTP (in the spirit of AlpacaFarm).

Each simulated annotator has a hidden true-preference function (a score per prompt and
answer), noise (Bradley–Terry temperature on the score difference), a position bias, a speed,
and may be a bad actor (always-left, random clicker). They log in with API tokens and loop
next -> submit like a person at a browser would, retrying a failed submit with the same
idempotency key, so a dropped connection never loses or duplicates a label.

No Django imports: this runs as a plain HTTP client (also from benchmarks and other hosts).
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from annotation import hooks

ScoreFn = Callable[[str, str], float]


@dataclass(frozen=True)
class Profile:
    """How one simulated annotator behaves."""

    behaviour: str = "careful"  # careful | noisy | always_left | random
    noise: float = 0.1  # Bradley–Terry temperature on the true-score difference
    position_bias: float = 0.0  # probability of picking the left answer whatever it says
    seconds_per_item: float = 8.0  # reported time on task (and slept, divided by speedup)
    tie_margin: float = 0.05  # |score difference| under which a tie is declared, if allowed
    both_bad_below: float | None = None  # both scores under this -> "both bad", if allowed


PRESETS: dict[str, Profile] = {
    "careful": Profile("careful", noise=0.1, seconds_per_item=9.0),
    "noisy": Profile("noisy", noise=1.0, seconds_per_item=6.0),
    "biased": Profile("biased", noise=0.3, position_bias=0.5, seconds_per_item=5.0),
    "always_left": Profile("always_left", seconds_per_item=1.0),
    "random": Profile("random", seconds_per_item=1.5),
}


def hidden_quality(text: str) -> float:
    """Return a fixed latent quality in [-1, 1] for an answer (a stand-in true preference)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**63 - 1.0


def default_score(prompt: str, answer: str) -> float:
    """Score with a registered domain's true reward (e.g. the demo's) if one knows the prompt."""
    for scorer in hooks.answer_scorers():
        try:
            return scorer(prompt, answer)
        except ValueError:
            continue
    return hidden_quality(answer)


def prompt_text(payload: dict) -> str:
    """Return the prompt of a served item as text (the last user turn for chats)."""
    prompt = payload["prompt"]
    if prompt.get("messages"):
        users = [m["content"] for m in prompt["messages"] if m["role"] == "user"]
        return users[-1] if users else prompt["messages"][-1]["content"]
    return prompt["text"]


def decide(
    payload: dict, options: dict, profile: Profile, score: ScoreFn, rng: random.Random
) -> dict:
    """Return the submit body this annotator would send for a served item."""
    texts = [c["text"] for c in payload["candidates"]]
    k = len(texts)
    if options["task_kind"] == "ranking":
        if profile.behaviour == "always_left":
            return {"ranking": list(range(1, k + 1))}
        if profile.behaviour == "random":
            ranks = list(range(1, k + 1))
            rng.shuffle(ranks)
            return {"ranking": ranks}
        question = prompt_text(payload)
        # Plackett–Luce by Gumbel-perturbed utilities (Luce 1959; Gumbel-max trick).
        noisy = [
            score(question, t) / max(profile.noise, 1e-6) - math.log(-math.log(rng.random()))
            for t in texts
        ]
        order = sorted(range(k), key=lambda i: -noisy[i])
        ranks = [0] * k
        for rank, slot in enumerate(order, start=1):
            ranks[slot] = rank
        return {"ranking": ranks}

    allowed = options["choices"]
    if profile.behaviour == "always_left":
        return {"choice": "A"}
    if profile.behaviour == "random":
        return {"choice": rng.choice(allowed)}
    if rng.random() < profile.position_bias:
        return {"choice": "A"}
    question = prompt_text(payload)
    score_a, score_b = score(question, texts[0]), score(question, texts[1])
    if (
        profile.both_bad_below is not None
        and "both_bad" in allowed
        and max(score_a, score_b) < profile.both_bad_below
    ):
        return {"choice": "both_bad"}
    if "tie" in allowed and abs(score_a - score_b) < profile.tie_margin:
        return {"choice": "tie"}
    # Bradley–Terry: P(A) = sigmoid((s_A - s_B) / T) (Bradley & Terry 1952).
    z = (score_a - score_b) / max(profile.noise, 1e-6)
    p_a = 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))
    return {"choice": "A" if rng.random() < p_a else "B"}


# A judge sees the served payload and the project's options and returns a submit body.
Judge = Callable[[dict, dict], dict]
# Scores every answer to a prompt at once; the prompt is the chat messages when there are
# some, else the text.
BatchScoreFn = Callable[[str | list, list[str]], list[float]]


def model_judge(scores: BatchScoreFn, *, tie_margin: float = 0.0) -> Judge:
    """Return a judge that answers as a scoring model would: the higher score wins.

    Pairwise: A or B by score, "tie" (when allowed) only within `tie_margin`; rankings:
    dense ranks by score, equal scores tied when ties are allowed. No noise, no position bias.
    """

    def judge(payload: dict, options: dict) -> dict:
        prompt = payload["prompt"].get("messages") or payload["prompt"]["text"]
        values = scores(prompt, [c["text"] for c in payload["candidates"]])
        if options["task_kind"] == "ranking":
            distinct = sorted(set(values), reverse=True)
            if len(distinct) == len(values) or options.get("allow_tied_ranks"):
                return {"ranking": [distinct.index(v) + 1 for v in values]}
            order = sorted(range(len(values)), key=lambda i: (-values[i], i))
            ranks = [0] * len(values)
            for rank, slot in enumerate(order, start=1):
                ranks[slot] = rank
            return {"ranking": ranks}
        difference = values[0] - values[1]
        if "tie" in options["choices"] and abs(difference) <= tie_margin:
            return {"choice": "tie"}
        return {"choice": "A" if difference > 0 else "B"}

    return judge


@dataclass
class AnnotatorStats:
    name: str
    behaviour: str
    submitted: int = 0
    replayed: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)


class ApiClient:
    """A tiny client of the annotation API with retries on transient failures."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, retries: int = 8):
        self.base = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.timeout = timeout
        self.retries = retries
        self.retried = 0

    def post(self, path: str, body: dict | None = None) -> requests.Response:
        """POST with retries on connection errors, timeouts and 502/503/504 (same body, same key).

        A timed-out request may have been carried out: sending the same idempotency key again
        returns what it made instead of making it twice.
        """
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                response = self.session.post(
                    self.base + path, json=body or {}, timeout=self.timeout
                )
                if response.status_code not in (502, 503, 504) or attempt == self.retries:
                    return response
            except (requests.ConnectionError, requests.Timeout):
                if attempt == self.retries:
                    raise
            self.retried += 1
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def get(self, path: str) -> requests.Response:
        return self.session.get(self.base + path, timeout=self.timeout)


def token_for(base_url: str, username: str, password: str) -> str:
    """Log in over the API and return the user's token."""
    r = requests.post(
        base_url.rstrip("/") + "/api/auth/token/",
        data={"username": username, "password": password},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()["token"]


def run_annotator(
    *,
    base_url: str,
    token: str,
    project_id: int,
    name: str,
    profile: Profile,
    score: ScoreFn = default_score,
    max_items: int | None = None,
    speedup: float = 0.0,
    seed: int = 0,
    stop: threading.Event | None = None,
    judge: Judge | None = None,
) -> AnnotatorStats:
    """Label items until the project has none left for this annotator (or max_items).

    `judge` replaces the simulated person (profile and score) with, e.g., a reward model
    (`model_judge`); the profile still sets the reported time on task.
    """
    rng = random.Random(seed)
    api = ApiClient(base_url, token)
    stats = AnnotatorStats(name=name, behaviour=profile.behaviour)
    project = api.get(f"/api/projects/{project_id}/").json()
    options = {
        "task_kind": project["task_kind"],
        "choices": ["A", "B"]
        + (["tie"] if project["allow_tie"] else [])
        + (["both_bad"] if project["allow_both_bad"] else []),
        "allow_tied_ranks": project["allow_tie"],
    }
    while max_items is None or stats.submitted < max_items:
        if stop is not None and stop.is_set():
            break
        r = api.post(f"/api/projects/{project_id}/next/")
        if r.status_code == 204:
            break
        if r.status_code == 403:  # paused by quality control
            stats.errors.append(f"next: {r.json().get('code')}")
            break
        if r.status_code != 200:
            stats.errors.append(f"next: HTTP {r.status_code}")
            break
        payload = r.json()
        if judge is not None:
            body = judge(payload, options)
        else:
            body = decide(payload, options, profile, score, rng)
        spent = max(0.3, rng.gauss(profile.seconds_per_item, profile.seconds_per_item / 4))
        if speedup > 0:
            time.sleep(spent / speedup)
        body.update(idempotency_key=uuid.uuid4().hex, time_spent_ms=int(spent * 1000))
        s = api.post(f"/api/assignments/{payload['assignment_id']}/submit/", body)
        if s.status_code in (200, 201):
            stats.submitted += 1
            stats.replayed += int(s.json().get("replayed", False))
        elif s.status_code == 409:
            continue  # lease expired or already done: ask for the next item
        else:
            stats.errors.append(f"submit: HTTP {s.status_code} {s.text[:200]}")
            break
    stats.retries = api.retried
    return stats


def run_pool(
    *,
    base_url: str,
    project_id: int,
    annotators: list[tuple[str, str, Profile]],
    score: ScoreFn = default_score,
    max_items: int | None = None,
    speedup: float = 0.0,
    seed: int = 0,
    judges: dict[str, Judge] | None = None,
) -> list[AnnotatorStats]:
    """Run (name, token, profile) annotators in parallel threads; return their stats.

    `judges` maps an annotator's name to a judge that decides for it (see `model_judge`).
    """
    results: list[AnnotatorStats | None] = [None] * len(annotators)
    judges = judges or {}

    def work(i: int, name: str, token: str, profile: Profile) -> None:
        try:
            results[i] = run_annotator(
                base_url=base_url,
                token=token,
                project_id=project_id,
                name=name,
                profile=profile,
                score=score,
                max_items=max_items,
                speedup=speedup,
                seed=seed * 1000 + i,
                judge=judges.get(name),
            )
        except Exception as exc:  # a thread must report, not vanish
            results[i] = AnnotatorStats(name=name, behaviour=profile.behaviour, errors=[repr(exc)])

    threads = [
        threading.Thread(target=work, args=(i, name, token, profile))
        for i, (name, token, profile) in enumerate(annotators)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def parse_pool(spec: str) -> list[tuple[str, Profile]]:
    """Parse "careful:3,noisy:2,always_left:1" into (kind, profile) entries, one per annotator."""
    pool = []
    for part in spec.split(","):
        kind, _, count = part.strip().partition(":")
        if kind not in PRESETS:
            raise ValueError(f"unknown annotator kind {kind!r}; known: {', '.join(PRESETS)}")
        pool.extend((kind, PRESETS[kind]) for _ in range(int(count or 1)))
    return pool
