"""Endpoint generation against real local HTTP servers that misbehave (training.generation.openai).

Each server is a `http.server` in a thread on a loopback port, answering as a broken or slow
inference server would; the client under test is the real one.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training.generation import GenerationError, GenerationSettings
from training.generation.openai import EndpointClientSettings, OpenAICompatibleBackend

SETTINGS = GenerationSettings(temperature=0.7, top_p=0.9, max_new_tokens=5, seed=11)


def completion(text: str) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
        ],
        "usage": {"completion_tokens": 2, "prompt_tokens": 3, "total_tokens": 5},
    }


@contextlib.contextmanager
def http_server(answer):
    """Serve POSTs with ``answer(handler, body) -> (status, bytes)``; yield (base_url, log)."""
    log: dict = {"bodies": [], "headers": [], "in_flight": 0, "max_in_flight": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                log["bodies"].append(body)
                log["headers"].append(dict(self.headers))
                log["in_flight"] += 1
                log["max_in_flight"] = max(log["max_in_flight"], log["in_flight"])
            try:
                status, payload = answer(self, body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                with lock:
                    log["in_flight"] -= 1

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()


def backend(url: str, **client) -> OpenAICompatibleBackend:
    options = {"concurrency": 2, "timeout_seconds": 2.0, "retries": 1, "backoff_seconds": 0.05}
    return OpenAICompatibleBackend(
        endpoint="local",
        base_url=url,
        model="m",
        api_key="sk-test-secret",
        client=EndpointClientSettings(**{**options, **client}),
    )


def test_records_the_exact_request_and_never_the_key():
    def echo(handler, body):
        return 200, json.dumps(completion(f"answer seed {body['seed']}")).encode()

    with http_server(echo) as (url, log):
        out = backend(url).generate(
            ["Hi", [{"role": "user", "content": "Yo"}]],
            k=2,
            settings=SETTINGS,
            model_name="served-v1",
        )
    assert [len(row) for row in out] == [2, 2]
    sent = {b["seed"]: b for b in log["bodies"]}
    for row in out:
        for cand in row:
            config = cand["generation_config"]
            assert config["request"]["body"] == sent[config["seed"]]
            assert cand["text"] == f"answer seed {config['seed']}"
            assert config["backend"] == "openai" and config["endpoint"] == "local"
    assert out[0][0]["generation_config"]["request"]["body"] == {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 5,
        "seed": out[0][0]["generation_config"]["seed"],
    }
    # the key goes to the server as a bearer token, never into what is recorded
    assert all(h["Authorization"] == "Bearer sk-test-secret" for h in log["headers"])
    assert "sk-test-secret" not in json.dumps(out)
    assert "sk-test-secret" not in repr(backend(url))


def test_no_more_requests_in_flight_than_the_concurrency_limit():
    def slow(handler, body):
        time.sleep(0.3)
        return 200, json.dumps(completion("ok")).encode()

    with http_server(slow) as (url, log):
        backend(url, concurrency=3).generate(["a", "b", "c", "d"], k=2, settings=SETTINGS)
    assert len(log["bodies"]) == 8
    assert log["max_in_flight"] == 3


def test_a_server_error_is_retried_with_backoff():
    calls = {"n": 0}

    def flaky(handler, body):
        calls["n"] += 1
        if calls["n"] == 1:
            return 503, b'{"error": "warming up"}'
        return 200, json.dumps(completion("fine")).encode()

    with http_server(flaky) as (url, _log):
        out = backend(url, concurrency=1, retries=2).generate(["a"], k=1, settings=SETTINGS)
    assert out[0][0]["text"] == "fine" and calls["n"] == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_endpoint_that_does_not_answer_is_named():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(
        GenerationError, match=r"endpoint 'local': the server does not answer.*2 attempt"
    ):
        backend(url).generate(["a"], k=1, settings=SETTINGS)


def test_an_endpoint_that_times_out_is_named():
    def stuck(handler, body):
        time.sleep(3)
        return 200, json.dumps(completion("late")).encode()

    with http_server(stuck) as (url, log):
        started = time.monotonic()
        with pytest.raises(GenerationError, match=r"endpoint 'local': no answer within 0.5 s"):
            backend(url, timeout_seconds=0.5, retries=1).generate(["a"], k=1, settings=SETTINGS)
        assert time.monotonic() - started < 2.5
    assert len(log["bodies"]) == 2  # the first attempt and one retry


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"<html>gateway</html>", "not valid JSON"),
        (b'{"choices": []}', r"not a chat completion \(no choices\[0\].message.content\)"),
        (b'{"choices": [{"message": {"content": 7}}]}', "content is not a string"),
    ],
)
def test_a_malformed_answer_fails_the_whole_call(payload, problem):
    malformed = http_server(lambda handler, body: (200, payload))
    with malformed as (url, _log), pytest.raises(GenerationError, match=problem):
        backend(url).generate(["a", "b"], k=2, settings=SETTINGS)


def test_a_refused_request_is_not_retried_and_shows_the_server_message():
    refusing = http_server(lambda handler, body: (400, b'{"error": "max_tokens too large"}'))
    with refusing as (url, log), pytest.raises(GenerationError, match=r"HTTP 400.*too large"):
        backend(url, concurrency=1).generate(["a"], k=1, settings=SETTINGS)
    assert len(log["bodies"]) == 1
