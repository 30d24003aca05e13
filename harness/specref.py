"""The spec's own formulas, in float64, written from ``../shared/spec/`` and not
from impl: the oracle for what no reference can express (a decoration no HF or
llama.cpp family has, or a combination a family's config cannot say), and the
plain formula the kernel tests hold impl to.

Written the plain way -- loops over heads and queries, complex numbers for
RoPE, one row at a time for the norms -- so it shares no code and no
vectorisation trick with impl's one body. It reads impl's config dataclasses
(they are data: which decorations a layer has) and nothing else of impl.

``attn_layer`` follows ``attn_block_tail`` / ``push_and_attend_row`` /
``attn_branch_rows`` / ``project_attn_rows`` (attn_block.rs.txt) step by step;
``mla_layer`` follows ``mla_forward_token`` (mla.rs.txt). Both return the
canonical probes (``impl.trace.LAYER_PROBES`` names and shapes) of one
sequence, so a comparison can say where a difference starts.
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
def attn_layer(cfg, w: dict, x: np.ndarray) -> dict:
    """The attention half of one layer (an ``impl.config.LayerConfig``) over one
    sequence ``x[n, hidden]`` in the spec's order: the canonical probes."""
    n = x.shape[0]
    P = {"layer_in": x}
    if cfg.shape == "absent":  # deci.cpp: no branch, the residual passes through
        P["resid_mid"] = x
        return P
    a = norm(x, cfg.input_norm, w.get("attn_norm"), w.get("attn_norm_b"))
    P["attn_in"] = a
    if cfg.shape == "linear":  # AttnShape::Linear => o_proj.apply(normed), nothing else
        o = a @ w["wo"].T
        P["attn_out"] = o
        P["resid_mid"] = x + o
        return P
    H, Hkv, D, Dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    # project_qkv: weights only
    q, k, v = a @ w["wq"].T, a @ w["wk"].T, a @ w["wv"].T
    gate = None
    if cfg.q_gate_interleaved:  # split_interleaved_q_gate: per head [q(D) | gate(D)]
        qg = q.reshape(n, H, 2 * D)
        q, gate = qg[..., :D].reshape(n, H * D), qg[..., D:].reshape(n, H * D)
        if "bq_gate" in w:
            gate = gate + w["bq_gate"]
    # apply_qkv_bias_and_clamp, at the widths after the split
    q = q + w.get("bq", 0.0)
    k = k + w.get("bk", 0.0)
    v = v + w.get("bv", 0.0)
    if cfg.qkv_clamp is not None:
        q, k, v = (np.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k, v))
    q, k, v = q.reshape(n, H, D), k.reshape(n, Hkv, D), v.reshape(n, Hkv, Dv)
    P.update(q=q, k=k, v=v)

    def qk_norm(q, k):
        s = cfg.qk_norm
        if s.over == "head":
            return norm(q, s.norm, w.get("q_norm")), norm(k, s.norm, w.get("k_norm"))
        return (norm(q.reshape(n, -1), s.norm, w.get("q_norm")).reshape(q.shape),
                norm(k.reshape(n, -1), s.norm, w.get("k_norm")).reshape(k.shape))

    pos = np.arange(n)
    if cfg.qk_norm is not None and cfg.qk_norm.where == "pre_rope":
        q, k = qk_norm(q, k)
    if cfg.rope is not None:
        f, r = np.array(cfg.rope.inv_freq), cfg.rope.rotary_dim
        q = rope(q, pos, f, cfg.rope.layout, r)
        k = rope(k, pos, f, cfg.rope.layout, r)
        # apply_rope_attn_factor: YaRN's mscale on the rotated channels
        q[..., :r] *= cfg.rope.attention_factor
        k[..., :r] *= cfg.rope.attention_factor
    if cfg.qk_norm is not None and cfg.qk_norm.where == "post_rope":
        q, k = qk_norm(q, k)
    if cfg.temperature is not None:
        t = cfg.temperature
        q = q * (np.log1p(np.floor((pos + 1) / t.floor_scale)) * t.attn_scale + 1)[:, None, None]
    P.update(q_rope=q, k_rope=k)
    scale = D**-0.5 if cfg.scale is None else cfg.scale
    slopes = alibi_slopes(H, cfg.alibi_max_bias) if cfg.alibi_max_bias is not None else None
    heads, probs = attention(q, k, v, scale, window=cfg.window, softcap=cfg.softcap, sinks=w.get("sinks"),
                             slopes=slopes)
    P.update(attn_probs=probs, attn_heads=heads)
    # attn_branch_rows: the interleaved gate, then the output gate, then the sub-norm
    b = heads.reshape(n, H * Dv)
    if gate is not None:
        b = b * sig(gate)
    if cfg.output_gate:
        b = b * sig(a @ w["wg"].T + w.get("bg", 0.0))
    if cfg.sub_norm is not None:
        b = norm(b, cfg.sub_norm, w.get("sub_norm"))
    P["attn_branch"] = b
    # project_attn_rows: wo, its scale, THEN its bias, the value scale, the post norm
    o = b @ w["wo"].T
    if cfg.o_scale is not None:
        o = o * cfg.o_scale
    o = o + w.get("bo", 0.0)
    if cfg.value_scale is not None:
        o = o * cfg.value_scale
    if cfg.post_norm is not None:
        o = norm(o, cfg.post_norm, w.get("post_norm"), w.get("post_norm_b"))
    P["attn_out"] = o
    if cfg.residual == "sequential":
        P["resid_mid"] = x + o * cfg.residual_multiplier
    return P


# ----------------------------------------------------------------- MLA
def mla_layer(cfg, w: dict, x: np.ndarray) -> dict:
    """One MLA layer (an ``impl.mla.MlaConfig``) over ``x[n, hidden]``, the spec's
    ``mla_forward_token`` one position at a time in the NAIVE arithmetic (per-head
    K and V from the combined kv_b, which the absorbed form must equal; the
    combined kv_b is rebuilt from k_b / v_b where only those are given)."""
    n = x.shape[0]
    H, nope, rd, r, dv = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
    a = norm(x, cfg.input_norm, w.get("attn_norm"))
    if cfg.q_lora_rank is None:
        q = a @ w["wq"].T
    else:  # MlaQProj: q_a, its RMS norm, q_b
        q = norm(a @ w["wq_a"].T + w.get("bq_a", 0.0), cfg.q_a_norm, w["q_a_norm"]) @ w["wq_b"].T
    q = q.reshape(n, H, nope + rd)
    ckv = a @ w["wkv_a"].T + w.get("bkv_a", 0.0)
    c = norm(ckv[:, :r], cfg.kv_a_norm, w["kv_a_norm"])
    k_rot = ckv[:, r:]
    if "wkv_b" in w:
        kvb = w["wkv_b"].reshape(H, nope + dv, r)
    else:  # the split form's k_b [H, r, nope] (absorb direction) and v_b [H, v, r]
        kvb = np.concatenate([w["wk_b"].transpose(0, 2, 1), w["wv_b"]], axis=1)
    pos = np.arange(n)
    q_pe, k_pe = q[..., nope:], k_rot[:, None, :]
    if cfg.rope is not None:  # rotate_pe: bands / YaRN's factors, then its magnitude
        inv = np.array(cfg.rope.inv_freq)
        mag = 1.0
        if cfg.yarn is not None:
            inv, mag = inv / np.array(cfg.yarn.freq_factors), cfg.yarn.pe_magnitude
        q_pe = rope(q_pe, pos, inv, "interleaved", rd) * mag
        k_pe = rope(k_pe, pos, inv, "interleaved", rd) * mag
    k_pe = k_pe[:, 0, :]
    kv = np.einsum("tr,hcr->thc", c, kvb)  # per position, per head [k_nope | v]
    keys = np.concatenate([kv[..., :nope], np.repeat(k_pe[:, None, :], H, axis=1)], axis=-1)
    query = np.concatenate([q[..., :nope], q_pe], axis=-1)
    mscale = 1.0 if cfg.yarn is None else cfg.yarn.mscale
    scale = mscale**2 / math.sqrt(nope + rd)  # kq_scale(yarn, q_head_dim)
    heads, probs = attention(query, keys, kv[..., nope:], scale, head_map=list(range(H)))
    b = heads.reshape(n, H * dv)
    if cfg.use_output_gate:  # attn_out * sigmoid(g_proj(hidden)), hidden = the normed input
        b = b * sig(a @ w["wg"].T)
    o = b @ w["wo"].T + w.get("bo", 0.0)
    P = {"layer_in": x, "attn_in": a, "q": q, "kv_latent": c, "q_rope": query, "attn_probs": probs,
         "attn_heads": heads, "attn_branch": b, "attn_out": o}
    if rd:
        P.update(q_pe=q_pe, k_pe=k_pe)
    if cfg.residual == "sequential":
        P["resid_mid"] = x + o
    return P


def layer(cfg, w: dict, x: np.ndarray) -> dict:
    """The spec's probes of one layer of either kind."""
    return mla_layer(cfg, w, x) if hasattr(cfg, "kv_lora_rank") else attn_layer(cfg, w, x)
