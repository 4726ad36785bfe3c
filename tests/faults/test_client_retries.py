"""The simulated annotators' client retries a timed-out request with the same body.

A request that timed out may still have been carried out by the server; the retry carries
the same idempotency key, so the server answers with what the first one made. A server
that holds the first request until the second one arrives makes the timeout certain.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from annotation.simulation import ApiClient

pytestmark = pytest.mark.slow


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[dict] = []
        self.second_arrived = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if len(self.server.bodies) == 1:
            # hold the first request until the client has given up on it and sent it again
            self.server.second_arrived.wait(timeout=60)
            status, answer = 201, {"judgment_id": 7, "replayed": False}
        else:
            self.server.second_arrived.set()
            status, answer = 200, {"judgment_id": 7, "replayed": True}
        data = json.dumps(answer).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client hung up on the first request
            pass


def test_a_timed_out_submit_is_sent_again_with_the_same_key():
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        api = ApiClient(f"http://127.0.0.1:{server.server_port}", "token", timeout=0.5)
        body = {"choice": "A", "idempotency_key": "k-123"}
        response = api.post("/api/assignments/1/submit/", body)
    finally:
        server.second_arrived.set()
        server.shutdown()
        server.server_close()

    assert response.status_code == 200 and response.json()["replayed"] is True
    assert api.retried == 1
    assert server.bodies == [body, body]
