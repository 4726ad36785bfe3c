"""The WSGI entry point gunicorn loads: warmed up and frozen before the first request.

Run in a fresh interpreter under the production settings (a throwaway secret), since the test
process has long since imported everything and has its own collector state.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, sys
import config.wsgi
assert callable(config.wsgi.application)
assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
for name in ("kombu.transport.redis", "annotation.apis", "evaluation.apis"):
    assert name in sys.modules, name
print("frozen", gc.get_freeze_count())
"""


def test_importing_the_wsgi_app_loads_the_views_and_broker_and_freezes_them():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_SECRET_KEY": "x" * 64,
        "DJANGO_ALLOWED_HOSTS": "prefloop.example.org",
        "DATABASE_URL": "postgres://127.0.0.1:1/none",
        # Nothing may be reachable at import time: a broker down at start-up is not fatal.
        "CELERY_BROKER_URL": "redis://127.0.0.1:1/0",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("frozen")
