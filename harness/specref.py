"""The spec's own formulas, in float64, written from ``../shared/spec/`` and not
from impl: the oracle for what no reference can express (a decoration no HF or
llama.cpp family has, or a combination a family's config cannot say), and the
plain formula the kernel tests hold impl to.

Written the plain way -- loops over heads and queries, complex numbers for
RoPE, one row at a time for the norms -- so it shares no code and no
vectorisation trick with impl's one body. It reads impl's config dataclasses
(they are data: which decorations a layer has) and nothing else of impl.

Each layer kind writes its own formula from these pieces
(``harness/kinds/<kind>/spec.py``: attention follows ``attn_block_tail`` /
``push_and_attend_row`` / ``attn_branch_rows`` / ``project_attn_rows``, MLA
``mla_forward_token``); each returns the canonical probes (``contract.probes``
names and shapes) of one sequence, so a comparison can say where a difference
starts. ``harness.kinds.spec_layer`` dispatches by the description's kind.
"""

from __future__ import annotations

import math

import numpy as np


# ----------------------------------------------------------------- pieces
def rms(x, w=None, eps=1e-6, plus1=False):
    """``rms_norm``: x / sqrt(mean(x^2) + eps), times w (or 1 + w, gemma's convention)."""
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    if w is None:
        return y
    return y * (1 + w) if plus1 else y * w


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def norm(x, spec, w=None, b=None):
    """One ``impl.config.NormSpec`` applied by its formula."""
    if spec.kind == "none":
        return x
    if spec.kind == "layer":
        return layernorm(x, 1.0 if w is None else w, 0.0 if b is None else b, spec.eps)
    if spec.kind == "l2":
        return rms(x, None, spec.eps)
    y = rms(x, w, spec.eps, spec.kind == "rms1p")
    return y if b is None else y + b


def rope(x, pos, inv_freq, layout, rot):
    """x[n, h, d]; the leading ``rot`` channels rotated by complex multiplication,
    one pair at a time: neox pairs (i, i + rot/2), interleaved pairs (2i, 2i+1)
    (spec apply_rope_interleaved)."""
    out = x.copy()
    half = rot // 2
    for t in range(x.shape[0]):
        for i in range(half):
            z = np.exp(1j * pos[t] * inv_freq[i])
            a, b = (x[t, :, i], x[t, :, i + half]) if layout == "neox" else (x[t, :, 2 * i], x[t, :, 2 * i + 1])
            c = (a + 1j * b) * z
            if layout == "neox":
                out[t, :, i], out[t, :, i + half] = c.real, c.imag
            else:
                out[t, :, 2 * i], out[t, :, 2 * i + 1] = c.real, c.imag
    return out


def sig(x):
    return 1 / (1 + np.exp(-x))


def alibi_slopes(n_heads: int, max_bias: float) -> list[float]:
    """ALiBi slopes (llama.cpp ggml_soft_max's m0 / m1 rule, HF bloom build_alibi_tensor)."""
    n_log2 = 2 ** math.floor(math.log2(n_heads))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-max_bias / 2.0 / n_log2)
    return [m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_heads)]


def lowest_visible(window, t: int) -> int:
    """spec layer_window_for_query: sliding counts the query itself; chunked is the query's chunk."""
    return t - window.size + 1 if window.kind == "sliding" else (t // window.size) * window.size


def attention(q, k, v, scale, *, window=None, softcap=None, sinks=None, slopes=None, head_map=None):
    """q[n, H, D], k[n, Hkv, D], v[n, Hkv, Dv], positions 0..n-1 (spec
    causal_gqa_attention_row, one query at a time): ``(heads[n, H, Dv], probs[H, n, n])``."""
    n, H, _ = q.shape
    hkv = k.shape[1]
    out = np.zeros((n, H, v.shape[2]))
    probs = np.zeros((H, n, n))
    for h in range(H):
        g = h // (H // hkv) if head_map is None else head_map[h]
        for t in range(n):
            logits = []
            for j in range(n):
                if j > t or (window is not None and j < lowest_visible(window, t)):
                    logits.append(-math.inf)
                    continue
                s = float(q[t, h] @ k[j, g]) * scale
                if softcap is not None and sinks is None:  # "the sink arm carries no softcap"
                    s = softcap * math.tanh(s / softcap)
                if slopes is not None:
                    s += slopes[h] * (j - t)
                logits.append(s)
            logits = np.array(logits)
            m = logits.max() if sinks is None else max(logits.max(), sinks[h])
            e = np.exp(logits - m)
            p = e / (e.sum() + (0.0 if sinks is None else math.exp(sinks[h] - m)))
            probs[h, t] = p
            out[t, h] = p @ v[:, g]
    return out, probs


# ----------------------------------------------------------------- the GQA layer
