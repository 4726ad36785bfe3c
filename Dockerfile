# syntax=docker/dockerfile:1
# One image for the web app, the Celery workers and beat (see docker-compose.yml).
#
#   docker build -t prefloop .                      # CPU torch wheel (web, worker-cpu, beat)
#   docker build -t prefloop-gpu \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .   # GPU workers
#
# No secret is baked in: settings come from the environment at run time (.env.example).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

# Where torch comes from: the CPU wheel by default; a CUDA index for the GPU worker image.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv
WORKDIR /build
COPY requirements.txt ./
# torch first, at the version requirements.txt pins, from the chosen index; the pinned
# requirements then find it installed (2.x.y+cpu / +cu128 satisfies ==2.x.y).
RUN TORCH_VERSION="$(sed -n 's/^torch==//p' requirements.txt)" \
 && test -n "$TORCH_VERSION" \
 && pip install --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}" \
 && pip install -r requirements.txt

# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="prefloop" \
      org.opencontainers.image.description="Prefloop: preference annotation, QC, training"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=config.settings.production \
    DJANGO_STATIC_ROOT=/app/staticfiles \
    PREFLOOP_ARTIFACT_ROOT=/var/lib/prefloop/artifacts \
    HF_HOME=/var/lib/prefloop/hf-cache \
    HF_HUB_DISABLE_TELEMETRY=1 \
    TOKENIZERS_PARALLELISM=false

# pg_dump/pg_restore for scripts/backup.sh; Debian bookworm ships client 15, the same
# major version as the db service (pg_dump must not be older than the server).
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-client \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 prefloop \
 && useradd --system --uid 10001 --gid prefloop --home-dir /app --shell /usr/sbin/nologin prefloop

COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# The code stays owned by root: the app user can read it but not change it.
COPY . /app

# Hashed, compressed static files are part of the image (whitenoise serves them), so every
# web replica has the same manifest. The base settings need no secret for this step.
RUN DJANGO_SETTINGS_MODULE=config.settings.base python manage.py collectstatic --noinput \
 && python -m compileall -q /app \
 && mkdir -p /var/lib/prefloop/artifacts /var/lib/prefloop/hf-cache /backups \
 && chown -R prefloop:prefloop /var/lib/prefloop /backups

USER prefloop:prefloop
EXPOSE 8000

# Ask the app itself (admin login page) over loopback, with a host it accepts and the
# header the TLS proxy would set, so SECURE_SSL_REDIRECT does not answer instead.
HEALTHCHECK --interval=30s --timeout=10s --start-period=40s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as u; h = os.environ.get('DJANGO_ALLOWED_HOSTS', '').split(',')[0].strip().lstrip('.*') or 'localhost'; u.urlopen(u.Request('http://127.0.0.1:8000/admin/login/', headers={'Host': h, 'X-Forwarded-Proto': 'https'}), timeout=8)"]

CMD ["gunicorn", "--config", "config/gunicorn.conf.py"]
