#!/usr/bin/env bash
# The device check (README "GPU"): impl on a GPU in one go, under 5 minutes.
#
#   bash scripts/device_check.sh               # on cuda or mps, whichever torch sees
#   DEVICE=cpu bash scripts/device_check.sh    # the CPU-sized check (CI runs this)
#
# 1. preflight (scripts/device_preflight.py): one line naming python, torch, the
#    device and every missing package; skips (the llama.cpp reference where
#    llama-cpp-python is absent, a family the installed transformers lacks) are
#    recorded with their reasons, never silent;
# 2. the `gpu`-marked tests (with the `device`-marked ones on a GPU: the
#    placement guard under this machine's torch);
# 3. the smoke matrix's torch cases on the device in float32, float16 and
#    bfloat16 against each reference present (`python -m harness.cli matrix`);
# 4. one real-size layer timed against F.scaled_dot_product_attention on the
#    same device and weights, every KV mode (scripts/bench_device.py).
#
# Everything goes to one folder, at most 8 files and no subfolders (what the
# device tool brings back): summary.txt (read this), env.json, tests.log,
# matrix.log, matrix-summary.md, matrix-run.tar.gz (the whole run directory),
# bench.log, bench.json.
#
# Environment: DEVICE  auto (default: cuda, else mps), cuda, mps or cpu
#              OUT     the output folder (default ./device-check-<timestamp>); must be empty
#              PYTHON  the interpreter (default .venv/bin/python, else python3)
#              FAMILIES  matrix families: * or a comma list (default: all on a GPU, six on cpu)
#              JOBS    matrix workers (default: min(8, cores))
#              BENCH_ARGS  extra arguments for scripts/bench_device.py (e.g. --tokens 2048 on a small mps)
#              DEVICE_WHEELS=0  do not install the wheels in .whl/
# Exit status: 0 every step passed; 1 a step failed or ran out of time; 2 the
# check could not start (one line on stderr, nothing written).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1  # logs complete up to the moment a step runs out of time
T0=$(date +%s)
DEVICE=${DEVICE:-auto}
OUT=${OUT:-./device-check-$(date +%Y%m%d-%H%M%S)}

die() { echo "device_check: error: $*" >&2; exit 2; }

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
elif command -v python3 >/dev/null 2>&1; then PY=python3
else die "no python here (set PYTHON, or make .venv with scripts/setup.sh)"; fi
command -v "$PY" >/dev/null 2>&1 || die "PYTHON=$PY is not an interpreter here"
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  die "OUT=$OUT is not empty; give an empty or new folder"
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Wheels carried in .whl/ (scripts/device_wheels.sh): what the device machine lacks
# (array-api-compat) or has too old (transformers), installed to a scratch folder.
WHEELS=""
if [ "${DEVICE_WHEELS:-1}" != 0 ] && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/site" .whl/*.whl >"$WORK/wheels.log" 2>&1 \
    || die "installing the wheels in .whl/ failed: $(tail -1 "$WORK/wheels.log")"
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  WHEELS=$(cd .whl && ls ./*.whl | sed 's|^\./||' | tr '\n' ' ')
fi

"$PY" scripts/device_preflight.py --device "$DEVICE" --spec "$WORK/matrix.toml" --env "$WORK/env.json" \
  ${FAMILIES:+--families "$FAMILIES"} >"$WORK/preflight.log" 2>"$WORK/preflight.err"
rc=$?
cat "$WORK/preflight.log"
if [ $rc -ne 0 ]; then cat "$WORK/preflight.err" >&2; exit 2; fi
DEVICE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "$WORK/env.json")
XDIST=$("$PY" -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["xdist"]))' "$WORK/env.json")

mkdir -p "$OUT"
mv "$WORK/env.json" "$OUT/env.json"
SUMMARY="$OUT/summary.txt"
{
  echo "device check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$( [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && echo '-dirty')"
  [ -n "$WHEELS" ] && echo "wheels from .whl/: $WHEELS"
  cat "$WORK/preflight.log"
} >"$SUMMARY"

CORES=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
JOBS=${JOBS:-$(( CORES < 8 ? CORES : 8 ))}
if [ "$DEVICE" = cpu ]; then
  # CI: the gpu tests only collect and skip (the device-marked ones ran in the suite)
  MARK="gpu"; LIMIT_TESTS=600; LIMIT_MATRIX=900; LIMIT_BENCH=600
else
  # the 5-minute budget: each step stops at its share, its log kept
  MARK="gpu or device"; LIMIT_TESTS=75; LIMIT_MATRIX=120; LIMIT_BENCH=60
fi
TIMEOUT=""
if command -v timeout >/dev/null 2>&1; then TIMEOUT=timeout
elif command -v gtimeout >/dev/null 2>&1; then TIMEOUT=gtimeout; fi

FAILED=()
# step NAME LIMIT_S LOG CMD...: run, log, one status line in the summary
step() {
  local name=$1 limit=$2 log=$3; shift 3
  local t=$(date +%s) rc status
  echo "== $name (up to ${limit}s): $*"
  if [ -n "$TIMEOUT" ]; then
    $TIMEOUT -k 10 "$limit" "$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
  else
    "$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
  fi
  case $rc in
    0) status=pass ;;
    124|137) status="FAIL: out of time after ${limit}s" ;;
    *) status="FAIL (exit $rc)" ;;
  esac
  [ "$status" = pass ] || FAILED+=("$name")
  echo "$name: $status, $(( $(date +%s) - t ))s" >>"$SUMMARY"
  return 0
}

# 2. the gpu tests: the files that mark any (collecting every test file would import
#    what the device machine may lack)
TEST_FILES=$(grep -l "mark\.gpu\|mark\.device" tests/test_*.py | tr '\n' ' ')
PAR=""
if [ "$XDIST" = 1 ] && [ "$DEVICE" != cpu ]; then PAR="-n $JOBS"; fi
# shellcheck disable=SC2086
step tests "$LIMIT_TESTS" "$OUT/tests.log" "$PY" -m pytest -m "$MARK" $TEST_FILES -q -rs -p no:cacheprovider $PAR
grep -E "^[0-9]+ (passed|failed|skipped|error)|^=+ .*(passed|failed|skipped|error)" "$OUT/tests.log" | tail -1 \
  | sed 's/^=* */  tests: /; s/ *=*$//' >>"$SUMMARY"

# 3. the smoke matrix's torch cases on the device
step matrix "$LIMIT_MATRIX" "$OUT/matrix.log" "$PY" -m harness.cli matrix "$WORK/matrix.toml" --out "$WORK/matrix" \
  --no-plots -j "$JOBS"
if [ -f "$WORK/matrix/summary.md" ]; then
  cp "$WORK/matrix/summary.md" "$OUT/matrix-summary.md"
fi
if [ -d "$WORK/matrix" ]; then
  tar -czf "$OUT/matrix-run.tar.gz" -C "$WORK" matrix
  grep -E "^(PASS|FAIL|ERROR): " "$OUT/matrix.log" | tail -1 | sed "s/^/  matrix: /" >>"$SUMMARY"
fi

# 4. one real-size layer, impl against SDPA
# shellcheck disable=SC2086
step bench "$LIMIT_BENCH" "$OUT/bench.log" "$PY" scripts/bench_device.py --device "$DEVICE" --out "$WORK/bench" ${BENCH_ARGS:-}
[ -f "$WORK/bench/bench.json" ] && cp "$WORK/bench/bench.json" "$OUT/bench.json"
[ -f "$WORK/bench/bench.md" ] && sed 's/^/  /' "$WORK/bench/bench.md" >>"$SUMMARY"

{
  echo
  if [ ${#FAILED[@]} -eq 0 ]; then
    echo "device check on $DEVICE: PASS in $(( $(date +%s) - T0 ))s"
  else
    echo "device check on $DEVICE: FAIL (${FAILED[*]}) in $(( $(date +%s) - T0 ))s"
  fi
  echo "folder: $OUT"
} >>"$SUMMARY"
echo
cat "$SUMMARY"
[ ${#FAILED[@]} -eq 0 ]
