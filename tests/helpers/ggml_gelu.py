"""ggml's CPU GELU, emulated: why llama.cpp's FFN differs from HF's by ~1e-3.

ggml/src/ggml-cpu/vec.h defines GGML_GELU_FP16; ``ggml_vec_gelu_f32`` and
``ggml_vec_geglu_f32`` then round x to fp16, read ``ggml_table_gelu_f16`` (the
tanh-approximated gelu of every fp16 value, stored as fp16) and return x itself
for x >= 10 and 0 for x <= -10. HF's ``gelu_pytorch_tanh`` computes the same
formula in fp32. Running HF's own FFN with this activation on llama.cpp's input
must reproduce llama.cpp's layer output (tests/test_family_gemma2.py, test_family_gemma3.py,
test_family_starcoder2.py): that pins the ref-vs-ref finding on its cause.
"""

from __future__ import annotations

import numpy as np


def gelu_fp16_table(x):
    import torch

    h = x.to(torch.float16).to(torch.float32)
    g = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * h * (1.0 + 0.044715 * h * h)))
    g = g.to(torch.float16).to(torch.float32)
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, g))


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def assert_fp16_gelu_explains_layer_out(lc_probes, ffn_half, exact_act) -> None:
    """HF's own FFN half ``ffn_half(x, act)`` (the residual included), run on
    llama.cpp's layer-0 ``resid_mid``, reproduces llama.cpp's ``layer_out`` with
    ggml's fp16 GELU table and does not with HF's exact activation ``exact_act``."""
    import torch

    with torch.no_grad():
        x = torch.as_tensor(lc_probes["L0.resid_mid"], dtype=torch.float32)
        exact = max_diff(ffn_half(x, exact_act).numpy(), lc_probes["L0.layer_out"])
        table = max_diff(ffn_half(x, gelu_fp16_table).numpy(), lc_probes["L0.layer_out"])
    assert exact > 1e-4 and table < 1e-5, (exact, table)


def gemma_ffn_half(layer):
    """``Gemma2DecoderLayer`` / ``Gemma3DecoderLayer``'s FFN half with the activation
    passed in: ``x + post_feedforward_layernorm(down(act(gate(h)) * up(h)))``, ``h =
    pre_feedforward_layernorm(x)``."""

    def ffn_half(x, act):
        h = layer.pre_feedforward_layernorm(x)
        h = layer.mlp.down_proj(act(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
        return x + layer.post_feedforward_layernorm(h)

    return ffn_half
