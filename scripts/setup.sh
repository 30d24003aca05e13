#!/usr/bin/env bash
# Create .venv and install the project with both references and the test tools.
# Idempotent: a second run only checks what is installed.
#
# llama-cpp-python builds llama.cpp from source the first time (about 5 minutes
# on 2 cores); pip caches the wheel, so later installs take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[llamacpp,dev]'
