"""Sample candidates from any OpenAI-compatible server (vLLM, SGLang, TGI, `transformers serve`).

No Django: the caller resolves the endpoint (name, base URL, model, key) and hands it in. One
chat-completion request per candidate, each with its own seed, at most `concurrency` in
flight; a request that cannot connect, times out or gets 429/5xx is retried with exponential
backoff. The exact request body (never the key) is recorded on each candidate. Anything else
(malformed JSON, no answer text, a 4xx) fails the whole call with GenerationError, so a round
is built from complete results or not at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

import requests

from training.generation.base import (
    Candidate,
    GenerationError,
    GenerationSettings,
    Prompt,
    candidate_seed,
    messages_of,
)

CHAT_PATH = "/v1/chat/completions"
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class EndpointClientSettings:
    """How hard to push an endpoint and how long to wait for it."""

    concurrency: int = 4
    timeout_seconds: float = 60.0
    retries: int = 2
    backoff_seconds: float = 0.5


class _Retryable(Exception):
    pass


class OpenAICompatibleBackend:
    """Generate through `POST {base_url}/v1/chat/completions`."""

    name = "openai"

    def __init__(
        self,
        *,
        endpoint: str,
        base_url: str,
        model: str,
        api_key: str = "",
        client: EndpointClientSettings | None = None,
    ):
        self.endpoint = endpoint
        self.url = base_url.rstrip("/").removesuffix("/v1") + CHAT_PATH
        self.model = model
        self._api_key = api_key
        self.client = client or EndpointClientSettings()
        self._local = threading.local()

    def __repr__(self) -> str:  # never show the key
        return f"OpenAICompatibleBackend(endpoint={self.endpoint!r}, model={self.model!r})"

    def request_body(self, prompt: Prompt, *, settings: GenerationSettings, seed: int) -> dict:
        """Return the JSON body sent for one candidate."""
        body = {
            "model": self.model,
            "messages": messages_of(prompt),
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_tokens": settings.max_new_tokens,
            "seed": seed,
        }
        if settings.top_k:
            body["top_k"] = settings.top_k  # vLLM and SGLang extension; omitted when off
        if settings.stop:
            body["stop"] = list(settings.stop)
        return body

    def generate(
        self,
        prompts: list[Prompt],
        *,
        k: int,
        settings: GenerationSettings,
        model_name: str = "",
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Candidate]]:
        """Return k candidates for each prompt, or raise GenerationError naming the problem."""
        jobs = [(i, j) for j in range(k) for i in range(len(prompts))]
        out: list[list[Candidate | None]] = [[None] * k for _ in prompts]
        with ThreadPoolExecutor(max_workers=max(1, self.client.concurrency)) as pool:
            futures = {
                pool.submit(self._candidate, prompts[i], j, k, settings, model_name): (i, j)
                for i, j in jobs
            }
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    error = future.exception()
                    if error is not None:
                        for other in pending:
                            other.cancel()
                        if isinstance(error, GenerationError):
                            raise error
                        raise GenerationError(f"endpoint {self.endpoint!r}: {error}") from error
                    i, j = futures[future]
                    out[i][j] = future.result()
                    if progress is not None:
                        progress(1)
        return out  # type: ignore[return-value]

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _candidate(
        self, prompt: Prompt, j: int, k: int, settings: GenerationSettings, model_name: str
    ) -> Candidate:
        seed = candidate_seed(settings.seed, prompt, j)
        body = self.request_body(prompt, settings=settings, seed=seed)
        answer = self._post(body)
        text, response = self._text_of(answer)
        return {
            "text": text.strip(),
            "model_name": model_name,
            "checkpoint_id": f"{self.endpoint}:{self.model}"[:200],
            "generation_config": {
                "backend": self.name,
                "endpoint": self.endpoint,
                "request": {"method": "POST", "path": CHAT_PATH, "body": body},
                "response": response,
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "top_k": settings.top_k,
                "max_new_tokens": settings.max_new_tokens,
                "stop": list(settings.stop),
                "seed": seed,
                "k": k,
            },
        }

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        timeout = (min(10.0, self.client.timeout_seconds), self.client.timeout_seconds)
        attempts = self.client.retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.client.backoff_seconds * 2 ** (attempt - 1))
            try:
                return self._post_once(body, headers=headers, timeout=timeout)
            except _Retryable as exc:
                last = str(exc)
        raise GenerationError(
            f"endpoint {self.endpoint!r}: {last} (gave up after {attempts} attempt(s))"
        )

    def _post_once(self, body: dict, *, headers: dict, timeout: tuple[float, float]) -> dict:
        try:
            reply = self._session().post(self.url, json=body, headers=headers, timeout=timeout)
        except requests.Timeout as exc:
            raise _Retryable(f"no answer within {self.client.timeout_seconds:g} s") from exc
        except requests.ConnectionError as exc:
            raise _Retryable("the server does not answer (connection failed)") from exc
        if reply.status_code in RETRY_STATUSES:
            raise _Retryable(f"the server answered HTTP {reply.status_code}")
        if reply.status_code >= 400:
            raise GenerationError(
                f"endpoint {self.endpoint!r}: the server refused the request with HTTP "
                f"{reply.status_code}: {reply.text[:300]}"
            )
        try:
            answer = reply.json()
        except (ValueError, json.JSONDecodeError) as exc:
            raise GenerationError(
                f"endpoint {self.endpoint!r}: the answer is not valid JSON "
                f"(starts {reply.text[:80]!r})"
            ) from exc
        return answer

    def _text_of(self, answer) -> tuple[str, dict]:
        try:
            choice = answer["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise GenerationError(
                f"endpoint {self.endpoint!r}: the answer is not a chat completion "
                "(no choices[0].message.content)"
            ) from exc
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise GenerationError(
                f"endpoint {self.endpoint!r}: choices[0].message.content is not a string"
            )
        response = {
            "id": str(answer.get("id", ""))[:100],
            "model": str(answer.get("model", ""))[:200],
            "finish_reason": choice.get("finish_reason"),
            "usage": answer.get("usage") if isinstance(answer.get("usage"), dict) else {},
        }
        return text, response
