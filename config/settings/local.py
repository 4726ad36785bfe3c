"""Zero-setup development and demo settings: SQLite and an in-process broker by default."""

from config.env import env
from config.settings.base import *  # noqa: F403
from config.settings.base import BASE_DIR

DEBUG = env.bool("DJANGO_DEBUG", default=True)
(BASE_DIR / "var").mkdir(exist_ok=True)

# Serve static files straight from the app folders: no collectstatic needed in development.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# Login lockout counters in local memory: enough for one development server, which is what
# django-axes' warning about a per-process cache is about (production uses Redis).
SILENCED_SYSTEM_CHECKS = ["axes.W001"]
WHITENOISE_AUTOREFRESH = DEBUG

# The embedded default: no broker to run. Tasks execute in the calling process unless a
# broker is configured (CELERY_BROKER_URL=redis://... CELERY_TASK_ALWAYS_EAGER=0).
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=True)
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
