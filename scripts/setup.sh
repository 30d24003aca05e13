#!/usr/bin/env bash
# Create .venv and install the project with both references and the test tools.
# Idempotent: a second run only checks what is installed.
#
# llama.cpp (llama-cpp-python) is built from source once per named set of ggml
# CPU kernels (scripts/build_llamacpp.sh; about 5 minutes on 2 cores) and the
# wheel is kept under ~/.cache/attn-conformance/wheels, so later installs take
# seconds. The set is CONFORMANCE_LLAMACPP_KERNELS (default avx2: x86-64-v3, the
# same kernels on every x86 machine, so a bound measured here holds on CI);
# avx512, sse42 and native are the others.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# avx2 where the CPU has x86-64-v3 (AVX2, FMA, F16C, BMI2), else sse42: an avx2
# build on an older CPU would die with SIGILL on its first matmul
default_kernels() {
  local flags
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  if [ -z "$flags" ]; then echo avx2; return; fi  # not Linux/x86: the build script picks ggml's own
  for f in avx2 fma f16c bmi2; do
    case " $flags " in *" $f "*) ;; *) echo sse42; return ;; esac
  done
  echo avx2
}
KERNELS=${CONFORMANCE_LLAMACPP_KERNELS:-$(default_kernels)}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
marker=.venv/llamacpp-kernels
# rebuilt when the kernels or the locked release changed (lock.txt), or it is missing
LOCKED_LLAMACPP=$(sed -n "s/^llama-cpp-python==//p" lock.txt)
if [ "$(cat "$marker" 2>/dev/null)" != "$KERNELS" ] || ! .venv/bin/python -c "import llama_cpp" 2>/dev/null \
   || [ "$(.venv/bin/python -c "from importlib.metadata import version; print(version('llama-cpp-python'))" 2>/dev/null)" != "$LOCKED_LLAMACPP" ]; then
  whl=$(PYTHON=.venv/bin/python bash scripts/build_llamacpp.sh "$KERNELS")
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$whl"
  echo "$KERNELS" > "$marker"
fi
# exactly the lock (lock.txt, written by scripts/lock.py): the versions every verdict and
# baseline was calibrated on, whatever the registry holds today
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c lock.txt -e '.[llamacpp,mlx,dev]'
# ... and nothing beside it: a package an earlier install left (a newer reference's own
# dependency, e.g. transformers 5.25's `kernels`, which changes how HF's functions are
# called) is removed, so this .venv is the lock whatever it held before
.venv/bin/python scripts/lock_sync.py
# Debian's chromium for the report.html browser test (tests/test_report_browser.py, headless over the
# DevTools protocol): installed where apt-get can (as root); elsewhere that test is skipped and says why
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
   && [ -z "${CONFORMANCE_CHROMIUM:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
      >/dev/null 2>&1 || echo "setup.sh: could not install chromium; tests/test_report_browser.py will be skipped" >&2
  else
    echo "setup.sh: no chromium and no root apt-get to install it; tests/test_report_browser.py will be skipped" >&2
  fi
fi
