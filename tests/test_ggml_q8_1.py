"""The Q4_1 / Q5_1 product as ggml's CPU computes it, against ggml's own kernels.

``harness/references/llamacpp/ggml_matmul.py`` reproduces what ggml does to the
activations before a quantized matmul. For Q4_1 / Q5_1 weights the dot
(``ggml_vec_dot_q4_1_q8_1`` / ``ggml_vec_dot_q5_1_q8_1``, ggml-cpu/arch/x86/quants.c)
also adds the block's weight minimum times ``s = fp16(d * sum(q))`` that
``quantize_row_q8_1`` stores: a float product on the rounded activations misses
that fp16 rounding (the held-out real Q4_1 file measured impl vs llama.cpp
``attn_out`` 1.05e-4 > 1e-4 from it). Here ggml's own exported
``quantize_row_q8_1`` and ``ggml_vec_dot_q*_1_q8_1`` (libggml-cpu of the
installed llama-cpp-python, the kernels llama.cpp runs) compute the product,
row by row, and ``q8_1_product`` must agree to float32 summation order -- and
the product without the minimum term must not (the test can fail).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest


def _ggml_cpu():
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"))
    lib.quantize_row_q8_1.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    for fn in ("ggml_vec_dot_q4_1_q8_1", "ggml_vec_dot_q5_1_q8_1"):
        getattr(lib, fn).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.ggml_cpu_init()  # ggml's fp16 tables and CPU feature detection, as the backend does
    return lib


def _activations(tokens: int, width: int, seed: int) -> np.ndarray:
    """Rows with a trained model's outlier channels (20-100x, as
    Family.realistic_weights makes them): the blocks holding them get a coarse d."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tokens, width)).astype(np.float32)
    cols = rng.choice(width, size=max(1, width // 64), replace=False)
    x[:, cols] *= rng.uniform(20, 100, size=cols.size).astype(np.float32)
    return x


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("wtype", ["Q4_1", "Q5_1"])
def test_q8_1_product_is_ggmls_dot(wtype):
    import gguf

    from harness.references.llamacpp.ggml_matmul import q8_1_product, round_q8_0

    lib = _ggml_cpu()
    vec_dot = getattr(lib, f"ggml_vec_dot_{wtype.lower()}_q8_1")
    qt = getattr(gguf.GGMLQuantizationType, wtype)
    width, out_f, tokens = 512, 24, 6
    rng = np.random.default_rng(1)
    # weights with an offset per row: the minimum term is large (a real layer's rows rarely centre on 0)
    w = (rng.normal(size=(out_f, width)) * 0.05 + rng.normal(size=(out_f, 1)) * 0.05).astype(np.float32)
    wq = np.ascontiguousarray(gguf.quants.quantize(w, qt))
    wd = gguf.quants.dequantize(wq, qt).reshape(out_f, width).astype(np.float32)
    x = _activations(tokens, width, 2)

    y_bytes = 36 * (width // 32)  # block_q8_1: d, s (fp16), 32 int8
    ref = np.zeros((tokens, out_f), dtype=np.float32)
    s = ctypes.c_float()
    for t in range(tokens):
        xr = np.ascontiguousarray(x[t])
        yq = (ctypes.c_uint8 * y_bytes)()
        lib.quantize_row_q8_1(xr.ctypes.data, yq, width)
        for o in range(out_f):
            vec_dot(width, ctypes.byref(s), 0, wq[o].ctypes.data, 0, yq, 0, 1)
            ref[t, o] = s.value

    ours = q8_1_product(x, wd.T)
    plain = round_q8_0(x) @ wd.T  # the activations rounded, the minimum's fp16 sum not
    scale = np.abs(ref).max()
    err, err_plain = np.abs(ours - ref).max() / scale, np.abs(plain - ref).max() / scale
    # float32 summation order only: a few ulps of the largest product
    assert err < 2e-6, err
    # the term is real: without it the product is off by far more (the test can fail)
    assert err_plain > 20 * err and err_plain > 1e-5, (err_plain, err)


def test_the_block_minimum_is_the_stored_minimum():
    """quantize_row_q4_1_ref gives each block's least element q = 0, so the least
    dequantized weight of a block IS its stored minimum m (read from the raw
    blocks here: d, m as fp16, then the quants)."""
    import gguf

    from harness.references.llamacpp.ggml_matmul import block_minima

    w = np.random.default_rng(3).normal(size=(8, 128)).astype(np.float32)
    for name, size in (("Q4_1", 20), ("Q5_1", 24)):
        qt = getattr(gguf.GGMLQuantizationType, name)
        raw = gguf.quants.quantize(w, qt).reshape(8, 128 // 32, size)
        m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        wd = gguf.quants.dequantize(raw.reshape(8, -1), qt).reshape(8, 128)
        assert np.array_equal(block_minima(wd, axis=-1), m)
