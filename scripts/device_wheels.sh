#!/usr/bin/env bash
# Fetch, here, the pure-Python wheels the device machine lacks or has too old,
# into .whl/ (git-ignored), for scripts/device_check.sh to install there:
#   array-api-compat  impl's array namespace (not in the device image at all)
#   transformers      the version this checkout's environment has (the image has
#                     an older 5.x that lacks some families' model types), so the
#                     HF captures there are the ones CI makes here
# Both are py3-none-any, so one wheel serves the device's Python 3.12. Their own
# dependencies are in the image (transformers: huggingface-hub, tokenizers,
# safetensors, regex, typer, ...). Then carry ".whl" in the device tool's run
# (README "GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
AAC=$("$PY" -c 'import array_api_compat; print(array_api_compat.__version__)')
TF=$("$PY" -c 'import transformers; print(transformers.__version__)')
mkdir -p .whl
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform any \
  -d .whl "array-api-compat==$AAC" "transformers==$TF"
ls -l .whl
du -sh .whl
