"""Production settings: every secret and host from the environment, hardened HTTP.

Required: DJANGO_SECRET_KEY, DJANGO_ALLOWED_HOSTS, DATABASE_URL (see .env.example and
docs/DEPLOY.md). Importing this module without them fails with ImproperlyConfigured.
"""

import shlex

from django.core.exceptions import ImproperlyConfigured

from config import postgres
from config.env import env
from config.settings.base import *  # noqa: F403
from config.settings.base import (
    CELERY_BROKER_TRANSPORT_OPTIONS,
    CELERY_BROKER_URL,
    MIDDLEWARE,
)


def _required(name: str, hint: str) -> str:
    value = env.str(name, default="").strip()
    if not value:
        raise ImproperlyConfigured(f"Set the {name} environment variable: {hint}")
    return value


DEBUG = False

SECRET_KEY = _required(
    "DJANGO_SECRET_KEY",
    "a long random string, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
)
if SECRET_KEY.startswith("insecure-") or len(SECRET_KEY) < 50:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is a placeholder or shorter than 50 characters; generate a new one."
    )

ALLOWED_HOSTS = [
    host.strip()
    for host in _required(
        "DJANGO_ALLOWED_HOSTS", "comma-separated host names, e.g. `prefloop.example.org`."
    ).split(",")
    if host.strip()
]
# Forms posted over HTTPS from these origins pass the CSRF check; by default every allowed
# host over https.
CSRF_TRUSTED_ORIGINS = env.list(
    "DJANGO_CSRF_TRUSTED_ORIGINS",
    default=[f"https://{host.lstrip('.')}" for host in ALLOWED_HOSTS if host != "*"],
)

DATABASES = {
    "default": env.db_url_config(
        _required("DATABASE_URL", "e.g. `postgres://prefloop:PASSWORD@db:5432/prefloop`.")
    ),
}
# Persistent connections per worker thread; 0 behind PgBouncer in transaction mode.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
postgres.use_for(DATABASES["default"])
# PgBouncer in transaction-pooling mode cannot keep the server-side cursors `.iterator()` uses.
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.bool(
    "DB_DISABLE_SERVER_SIDE_CURSORS", default=False
)

# TLS ends at the reverse proxy, which must set X-Forwarded-Proto (and strip it from clients).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env.int("DJANGO_SESSION_COOKIE_AGE", default=14 * 24 * 3600)
CSRF_COOKIE_SECURE = True
CSRF_COOKIE_SAMESITE = "Lax"

# The Content-Security-Policy header ('self' only) is set by django-csp; keep it on.
if "csp.middleware.CSPMiddleware" not in MIDDLEWARE:
    raise ImproperlyConfigured("csp.middleware.CSPMiddleware must be in MIDDLEWARE.")

# One cache for every web process and worker: login lockout counters (django-axes) must be
# seen by all of them. By default the broker's Redis (keys are prefixed, and expire).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env.str("DJANGO_CACHE_URL", default=CELERY_BROKER_URL),
        "KEY_PREFIX": "prefloop",
    },
}

# Training runs (training/processes.py): "python" runs one process per run; "accelerate" runs
# `accelerate launch <PREFLOOP_TRAINING_ACCELERATE_ARGS> -m training.trainers.cli ...`,
# e.g. "--multi_gpu --num_processes 4" for one run over the four GPUs of its worker.
TRAINING_LAUNCHER = env.str("PREFLOOP_TRAINING_LAUNCHER", default="python")
TRAINING_ACCELERATE_ARGS = shlex.split(env.str("PREFLOOP_TRAINING_ACCELERATE_ARGS", default=""))
# A run still going after this many seconds is stopped (0: no limit). It must stay below the
# broker's visibility timeout, or Redis hands the same run to a second worker meanwhile.
TRAINING_MAX_RUNTIME_SECONDS = env.int("PREFLOOP_TRAINING_MAX_RUNTIME_SECONDS", default=0)
if CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] <= TRAINING_MAX_RUNTIME_SECONDS:
    raise ImproperlyConfigured(
        "CELERY_VISIBILITY_TIMEOUT must be longer than PREFLOOP_TRAINING_MAX_RUNTIME_SECONDS."
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")},
    "loggers": {
        # 4xx/5xx with tracebacks; DisallowedHost floods from scanners are kept at WARNING.
        "django.request": {"level": "WARNING"},
        "django.security.DisallowedHost": {"level": "ERROR"},
    },
}
