"""The spec's own formula of one MLA layer, in float64: ``mla_forward_token``
(``spec/mla.rs.txt``) step by step, from the pieces in ``harness.specref`` --
no code shared with impl's body. Returns the canonical probes of one sequence."""

from __future__ import annotations

import math

import numpy as np

from ...specref import alibi_slopes, attention, layernorm, norm, rms, rope, sig  # noqa: F401


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
    q_nope = q[..., :nope]
    if cfg.temperature is not None:  # the whole query after RoPE (mistral4: HF get_llama_4_attn_scale)
        t = cfg.temperature
        tq = (np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1)[:, None, None]
        q_nope, q_pe = q_nope * tq, q_pe * tq
    kv = np.einsum("tr,hcr->thc", c, kvb)  # per position, per head [k_nope | v]
    keys = np.concatenate([kv[..., :nope], np.repeat(k_pe[:, None, :], H, axis=1)], axis=-1)
    query = np.concatenate([q_nope, q_pe], axis=-1)
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
