"""gunicorn settings for the web service: `gunicorn -c config/gunicorn.conf.py`.

Every value can be changed through the environment (see .env.example). The app answers
behind a TLS-terminating reverse proxy; see docs/DEPLOY.md for scaling out.
"""

import multiprocessing
import os

from config.env import env

wsgi_app = "config.wsgi:application"
# Never fall back to config.wsgi's development default under gunicorn.
settings_module = env.str("DJANGO_SETTINGS_MODULE", default="config.settings.production")
raw_env = [f"DJANGO_SETTINGS_MODULE={settings_module}"]

bind = env.list("GUNICORN_BIND", default=["0.0.0.0:8000"])
# Sync workers with a few threads each: requests are short database round trips.
workers = env.int("GUNICORN_WORKERS", default=min(2 * multiprocessing.cpu_count() + 1, 9))
threads = env.int("GUNICORN_THREADS", default=4)
worker_class = "gthread"
timeout = env.int("GUNICORN_TIMEOUT", default=60)
graceful_timeout = env.int("GUNICORN_GRACEFUL_TIMEOUT", default=30)
keepalive = env.int("GUNICORN_KEEPALIVE", default=5)
# Recycle workers now and then so slow leaks cannot grow without bound.
max_requests = env.int("GUNICORN_MAX_REQUESTS", default=2000)
max_requests_jitter = env.int("GUNICORN_MAX_REQUESTS_JITTER", default=200)
# Heartbeat files on tmpfs: a container's overlay filesystem can stall them.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
# Only the reverse proxy may set X-Forwarded-* headers that gunicorn trusts.
forwarded_allow_ips = env.str("GUNICORN_FORWARDED_ALLOW_IPS", default="127.0.0.1")
limit_request_line = 8190
accesslog = "-"
errorlog = "-"
loglevel = env.str("GUNICORN_LOG_LEVEL", default="info")
proc_name = "prefloop-web"
