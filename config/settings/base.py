"""Settings shared by every environment. Values come from the environment via config.env."""

from datetime import timedelta

from kombu import Queue

from config import postgres
from config.env import BASE_DIR, env

SECRET_KEY = env("DJANGO_SECRET_KEY", default="insecure-dev-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "django_celery_beat",
    "axes",
    "annotation",
    "training",
    "evaluation",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Token-authenticated per-item calls of annotators end here (annotation/fastpath.py):
    # nothing below applies to them.
    "annotation.fastpath.TokenFastPathMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: turns a lockout during login into a 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}"),
}
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
postgres.use_for(DATABASES["default"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Accounts: django-axes refuses a login (login page, admin, token endpoint) after
# LOGIN_FAILURE_LIMIT bad passwords for one username from one address, for
# LOGIN_COOLOFF_MINUTES. Its counters live in the default cache, which production points at
# Redis so every web process sees the same counts.
AUTHENTICATION_BACKENDS = [
    "annotation.auth.LoginLockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
AXES_HANDLER = "axes.handlers.cache.AxesCacheHandler"
AXES_FAILURE_LIMIT = env.int("PREFLOOP_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("PREFLOOP_LOGIN_COOLOFF_MINUTES", default=15))
# Behind the reverse proxy every client shares the proxy's address, so an address alone would
# lock everyone out at once: count per username and address together.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# API tokens of human accounts stop working this long after they were issued; logging in
# at /api/auth/token/ again issues a new one. Machine accounts get a fresh token per run.
# The serving statements are prepared once per database connection (annotation/sql.py); a
# connection pooler in transaction mode without protocol-level prepared statements needs 0.
SERVING_PREPARED_STATEMENTS = env.bool("SERVING_PREPARED_STATEMENTS", default=True)
API_TOKEN_LIFETIME = timedelta(days=env.int("PREFLOOP_API_TOKEN_DAYS", default=30))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = env.path("DJANGO_STATIC_ROOT", default=BASE_DIR / "staticfiles")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.storage.StaticFilesStorage"},
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "annotate-home"
LOGOUT_REDIRECT_URL = "login"

# Where datasets, checkpoints and plots are written.
ARTIFACT_ROOT = env.path("PREFLOOP_ARTIFACT_ROOT", default=BASE_DIR / "var" / "artifacts")
# Whom a paused annotator may write to (an e-mail address or a URL), shown beside the
# project's researchers on the paused page; empty: the researchers only.
PREFLOOP_ANNOTATOR_CONTACT = env("PREFLOOP_ANNOTATOR_CONTACT", default="")

# Training security (training/config_policy.py). Reward functions a training config may
# name: name -> "module:function", set by the deployment (JSON in the environment); requests
# give a name, never an import path.
PREFLOOP_REWARD_FUNCTIONS = env.json(
    "PREFLOOP_REWARD_FUNCTIONS", default={"demo": "training.demo:true_reward"}
)
# Folders besides ARTIFACT_ROOT where staff may point a run at models, tokenizers or data
# (e.g. a read-only mount of base models); every path must resolve inside one of them.
PREFLOOP_MODEL_ROOTS = env.list("PREFLOOP_MODEL_ROOTS", default=[])
# Extra environment variables the training subprocess inherits (it gets a minimal set).
PREFLOOP_TRAINING_ENV_PASSTHROUGH = env.list("PREFLOOP_TRAINING_ENV_PASSTHROUGH", default=[])

# Generation (training/generation/). Local policies are sampled by "transformers" (batched,
# left padding) or "vllm" (its offline engine; GPU images with vllm installed). Policies of
# kind "endpoint" go to the OpenAI-compatible servers declared here as JSON: name ->
# {"base_url", "models": [...], "api_key_env": the variable holding the key (read at call
# time, never stored, never given to training processes), optional "concurrency",
# "timeout_seconds", "retries"}. Researchers pick a name and a model, never a URL.
PREFLOOP_GENERATION_LOCAL_BACKEND = env("PREFLOOP_GENERATION_LOCAL_BACKEND", default="transformers")
PREFLOOP_GENERATION_ENDPOINTS = env.json("PREFLOOP_GENERATION_ENDPOINTS", default={})

# Training runs (training/supervisor.py, processes.py). Runs are written under
# TRAINING_OUTPUT_ROOT/run-<id>/ (None: ARTIFACT_ROOT/training). The launcher is "python",
# "accelerate" (with TRAINING_ACCELERATE_ARGS) or a list used as the command's prefix.
TRAINING_OUTPUT_ROOT = None
TRAINING_LAUNCHER = "python"
TRAINING_ACCELERATE_ARGS: list[str] = []
# The supervisor polls the run's files this often, and a run whose supervisor sent no
# heartbeat for TRAINING_HEARTBEAT_STALE_SECONDS is taken over (it resumes from a checkpoint).
TRAINING_POLL_SECONDS = 1.0
TRAINING_HEARTBEAT_STALE_SECONDS = 60
# Seconds between SIGTERM and SIGKILL when a run is cancelled or stopped.
TRAINING_KILL_GRACE_SECONDS = 10
# A run still going after this many seconds is stopped (0: no limit).
TRAINING_MAX_RUNTIME_SECONDS = 0
# A run does not start with less free space than this in its folder.
TRAINING_MIN_FREE_BYTES = 1 << 30
# Lines of the training log kept on the run's row.
TRAINING_LOG_TAIL_LINES = 50
# The supervisor checks a run's reward-hacking alarms (training/alarms.py) this often, and
# once more when the run ends.
TRAINING_ALARM_CHECK_SECONDS = 10.0

# Imports (annotation/imports/): the largest upload taken, the largest file once
# decompressed, and the longest line, in bytes; a file past a limit is refused whole with a
# 413. Uploads larger than IMPORT_ASYNC_BYTES are imported by a Celery task instead of the
# request (progress at /api/projects/{id}/imports/{job}/).
IMPORT_MAX_UPLOAD_BYTES = env.int("PREFLOOP_IMPORT_MAX_UPLOAD_BYTES", default=1 * 2**30)
IMPORT_MAX_BYTES = env.int("PREFLOOP_IMPORT_MAX_BYTES", default=2 * 2**30)
IMPORT_MAX_LINE_BYTES = env.int("PREFLOOP_IMPORT_MAX_LINE_BYTES", default=16 * 2**20)
IMPORT_ASYNC_BYTES = env.int("PREFLOOP_IMPORT_ASYNC_BYTES", default=8 * 2**20)

# Model uploads (training/registry.py): the largest archive a researcher may upload, and the
# most its files may hold once unpacked, in bytes; past either it is refused with a 413 and
# nothing is kept.
PREFLOOP_MODEL_UPLOAD_MAX_BYTES = env.int("PREFLOOP_MODEL_UPLOAD_MAX_BYTES", default=4 * 2**30)
PREFLOOP_MODEL_UNPACKED_MAX_BYTES = env.int("PREFLOOP_MODEL_UNPACKED_MAX_BYTES", default=8 * 2**30)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "annotation.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Every list answers bounded pages (annotation/pagination.py: at most 500 rows).
    "DEFAULT_PAGINATION_CLASS": "annotation.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "annotation.apis.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Prefloop API",
    "DESCRIPTION": "Blind pairwise and K-way preference annotation, QC, exports and training.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
}

# Content Security Policy: only our own static files, no inline script.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    },
}

# Celery: training/generation on `gpu` (prefetch 1, late ack), everything else on `default`.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_QUEUES = (Queue("default"), Queue("gpu"))
CELERY_TASK_ROUTES = {
    "training.tasks.*": {"queue": "gpu"},
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Longer than the longest training run, so a slow run is not redelivered while alive.
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=12 * 3600),
}
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# A run whose worker died is taken over within a minute, not after the visibility timeout.
CELERY_BEAT_SCHEDULE = {
    "requeue-stale-training-runs": {"task": "training.tasks.requeue_stale_runs", "schedule": 60.0},
}
CELERY_TIMEZONE = TIME_ZONE

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="WARNING")},
}

# --- Deploy (issue #10): Swagger UI and Redoc from our own static files -------------------
# The docs pages load their JS/CSS from drf-spectacular-sidecar instead of a CDN, so the
# CSP above ('self' only) holds for them too.
INSTALLED_APPS += ["drf_spectacular_sidecar"]
SPECTACULAR_SETTINGS |= {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
