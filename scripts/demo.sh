#!/usr/bin/env bash
# One command for the whole loop on this machine: set up .venv, then run the demo with the
# embedded defaults (SQLite in var/, training in-process, web app on http://127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
export HF_DATASETS_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export DJANGO_DEBUG="${DJANGO_DEBUG:-0}"
# The demo runs on the local settings (SQLite, in-process tasks), whatever the shell exports;
# the web server it starts is given the same module.
export DJANGO_SETTINGS_MODULE=config.settings.local
exec .venv/bin/python manage.py demo "$@"
