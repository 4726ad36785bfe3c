"""Test settings: PostgreSQL (the tests are about concurrency and locking) and fast hashing."""

import tempfile

from config import postgres
from config.env import env
from config.settings.base import *  # noqa: F403
from config.settings.base import BASE_DIR

DATABASES = {
    "default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/prefloop"),
}
DATABASES["default"]["CONN_MAX_AGE"] = 0
postgres.use_for(DATABASES["default"])
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ARTIFACT_ROOT = BASE_DIR / "var" / "test-artifacts"
# Tests build their tiny models and snapshots under the system temp folder (pytest tmp_path).
PREFLOOP_MODEL_ROOTS = env.list("PREFLOOP_MODEL_ROOTS", default=[tempfile.gettempdir()])
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/15")
