"""Real services for fault tests: gunicorn, a private redis-server and Celery workers.

Every process is started on a free port or a private queue and stopped by its own pid, so
tests never touch the shared Redis on 6379 or another developer's workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from django.conf import settings

from tests.celery_worker import Worker, database_url
from tests.training.test_runs_support import wait_for

__all__ = ["CeleryWorker", "Gunicorn", "RedisServer", "database_url", "free_port", "wait_for"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Gunicorn:
    """gunicorn with the production config file, on a free port, against the test database."""

    def __init__(self, log_path: Path, *, workers: int = 2, threads: int = 4, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = log_path.open("ab")
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DJANGO_DEBUG": "0",
            "DATABASE_URL": database_url(),
            "DB_CONN_MAX_AGE": "60",  # persistent connections, as deployed
            "GUNICORN_BIND": f"127.0.0.1:{self.port}",
            "GUNICORN_WORKERS": str(workers),
            "GUNICORN_THREADS": str(threads),
            "GUNICORN_LOG_LEVEL": "warning",
            "DJANGO_LOG_LEVEL": "ERROR",
            **env,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py"],
            cwd=str(settings.BASE_DIR),
            env=environment,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._ready, timeout=60, interval=0.2, what=f"gunicorn on {self.url}")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"gunicorn exited:\n{self.text()[-3000:]}")
        try:
            return requests.get(self.url + "/admin/login/", timeout=10).status_code == 200
        except requests.RequestException:
            return False

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.log.close()


class RedisServer:
    """A private redis-server on a free port; `durable` keeps data like production's AOF."""

    def __init__(self, folder: Path, *, durable: bool):
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.durable = durable
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            if self.durable
            else ["--appendonly", "no", "--save", ""]
        )
        self.log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.folder),
                "--maxmemory-policy",
                "noeviction",
                *persistence,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self.ping, timeout=30, interval=0.1, what=f"redis on port {self.port}")

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5)

    def ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def stop(self) -> None:
        """Stop the server: SIGTERM, which writes the AOF when durable and loses all otherwise."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
        with contextlib.suppress(Exception):
            self.log.close()

    def restart(self, *, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()


# The training tests' worker, on a broker, queue and environment of our choosing.
CeleryWorker = Worker
