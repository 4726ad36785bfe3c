"""A real `celery worker` subprocess for tests, on the pytest-django test database.

Used by the worker-kill, broker-outage and loop end-to-end tests: each starts workers on a
broker and queue of its own, reads their logs, and kills them (with their pool children and
training processes) by process tree, never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from django.conf import settings
from django.db import connection


def worker_argv(queue: str, hostname: str) -> list[str]:
    """The command line of one `celery worker` of this app (concurrency 1, prefork, no
    gossip/mingle/heartbeat chatter); also used by the benchmarks."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "-Q",
        queue,
        "--concurrency",
        "1",
        "--pool",
        "prefork",
        "--loglevel",
        "INFO",
        "--hostname",
        f"{hostname}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def database_url() -> str:
    """Return the URL of the database this test runs on (the pytest-django test database)."""
    db = connection.settings_dict
    user = db.get("USER") or "postgres"
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


class Worker:
    """One `celery -A config worker` process (concurrency 1) writing its log to a file."""

    def __init__(
        self,
        *,
        queue: str,
        broker_url: str,
        log_path: Path,
        name: str,
        visibility_timeout: int | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        self.log_path = log_path
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": broker_url,
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        if visibility_timeout is not None:
            env["CELERY_VISIBILITY_TIMEOUT"] = str(visibility_timeout)
        self.log = log_path.open("ab")
        self.process = subprocess.Popen(
            worker_argv(queue, name),
            cwd=str(settings.BASE_DIR),
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        try:
            parent = psutil.Process(self.process.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> list[psutil.Process]:
        """SIGKILL the worker and every process below it (pool child, training CLI)."""
        processes = self.tree()
        for proc in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=15)
        self.process.wait(timeout=15)
        self.log.close()
        return processes

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then kill whatever is left of the process tree."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        for proc in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.log.close()
