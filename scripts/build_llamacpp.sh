#!/usr/bin/env bash
# Build llama-cpp-python (the llama.cpp reference) for one named set of ggml CPU
# kernels, once, into a wheel kept outside the checkout; print the wheel's path.
#
#   scripts/build_llamacpp.sh [VARIANT]      VARIANT: avx2 (default), avx512, amx, sse42, native
#   LLAMACPP_VERSION=0.3.35 scripts/build_llamacpp.sh   another release than the lock's
#
# Why a named set and not pip's default build: llama-cpp-python builds with
# -march=native (GGML_NATIVE), so the kernels ggml runs -- and so the rounding of
# every llama.cpp result the harness compares against -- depend on the machine
# that happened to build it. On a CPU that reports AMX but whose host does not
# let a process use it, the native build dies with SIGILL (`tilezero`) on the
# first quantized matmul. The default `avx2` is x86-64-v3 (SSE4.2, AVX, AVX2,
# FMA, F16C, BMI2: ggml's GGML_NATIVE=OFF defaults), the same on every CI
# machine; `avx512` (+ AVX512F/BW/DQ/VL/VBMI/VNNI/BF16, no AMX: BF16 weights
# take _mm512_dpbf16_ps in ggml_vec_dot_bf16), `amx` (avx512 + AMX-TILE/INT8/BF16:
# ggml-cpu/amx takes the Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K / IQ4_XS matmuls
# onto int8 tiles where the kernel grants the process AMX -- what a plain build
# picks on a Sapphire Rapids Xeon) and `sse42` (no AVX, FMA or F16C: fp16
# converted in software) are the other x86 kernel sets the tolerances are
# measured on (scripts/measure_cpu_variants.py). `native` is what a plain
# `pip install llama-cpp-python` gives.
#
# pip's wheel cache is keyed by the source, not by CMAKE_ARGS, so each variant's
# wheel is kept in its own folder: $CONFORMANCE_WHEELS (default
# ~/.cache/attn-conformance/wheels)/<version>-<variant>/.
set -euo pipefail
VARIANT=${1:-avx2}
# the release: the lock's (lock.txt), or LLAMACPP_VERSION (`conformance upstream` builds others)
VERSION=${LLAMACPP_VERSION:-$(sed -n 's/^llama-cpp-python==//p' "$(dirname "$0")/../lock.txt")}
if [ -z "$VERSION" ]; then echo "build_llamacpp.sh: no llama-cpp-python in lock.txt and no LLAMACPP_VERSION" >&2; exit 2; fi
case "$(uname -m)" in
  x86_64|amd64) X86=1 ;;
  *) X86=0 ;;
esac
case "$VARIANT" in
  avx2) ARGS="-DGGML_NATIVE=OFF" ;;
  avx512) ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" ;;
  amx) ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=ON" ;;
  sse42) ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF" ;;
  native) ARGS="" ;;
  *) echo "build_llamacpp.sh: unknown variant '$VARIANT'; valid: avx2, avx512, amx, sse42, native" >&2; exit 2 ;;
esac
if [ "$X86" = 0 ] && [ "$VARIANT" != native ]; then
  VARIANT=native  # the x86 kernel sets mean nothing elsewhere: ggml's own defaults there
  ARGS=""
fi
ARGS="$ARGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
DIR=${CONFORMANCE_WHEELS:-$HOME/.cache/attn-conformance/wheels}/$VERSION-$VARIANT
PY=${PYTHON:-python3}
whl=$(ls "$DIR"/llama_cpp_python-$VERSION-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$whl" ]; then
  mkdir -p "$DIR"
  tmp=$(mktemp -d "$DIR/.build-XXXXXX")
  echo "building llama-cpp-python $VERSION ($VARIANT kernels; ~5 minutes on 2 cores)" >&2
  CMAKE_ARGS="$ARGS" "$PY" -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python \
    -w "$tmp" "llama-cpp-python==$VERSION" >&2
  built=$(ls "$tmp"/llama_cpp_python-*.whl | head -n 1)
  mv "$built" "$DIR/"  # a rename inside one folder: a concurrent reader sees the whole wheel or none
  rm -rf "$tmp"
  whl="$DIR/$(basename "$built")"
fi
echo "$whl"
