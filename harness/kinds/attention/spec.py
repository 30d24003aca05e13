"""The spec's own formula of one attention layer, in float64: ``attn_block_tail`` /
``push_and_attend_row`` / ``attn_branch_rows`` / ``project_attn_rows``
(``spec/attn_block.rs.txt``) step by step, written the plain way from the
pieces in ``harness.specref`` -- no code shared with impl's body. Returns the
canonical probes (``contract.probes`` names and shapes) of one sequence."""

from __future__ import annotations

import numpy as np

from ...specref import alibi_slopes, attention, layernorm, norm, rms, rope, sig  # noqa: F401


def attn_layer(cfg, w: dict, x: np.ndarray, kv=None, want_kv: bool = False):
    """The attention half of one layer (an ``impl.config.LayerConfig``) over one
    sequence ``x[n, hidden]`` in the spec's order: the canonical probes.

    ``kv``: for a layer reading another layer's K/V (``kv_source``), the source's cached
    ``(k, v)`` over the same positions -- what ``want_kv`` returns beside the probes
    (``(probes, (k, v))``: K after its norm and RoPE, V after its norm, as the cache holds
    them; HF ``Gemma3nTextAttention.forward``'s ``shared_kv_states``)."""
    if (kv is not None) != (getattr(cfg, "kv_source", None) is not None):
        raise ValueError("kv (the source's cached K/V) goes with a kv_source layer, and only with one")
    if getattr(cfg, "parallel_ssm", None) is not None:
        # the Mamba-2 kind has no spec formula yet (harness/kinds/recurrent/spec.py SUPPORTED):
        # refused rather than a formula that silently leaves the branch out
        raise NotImplementedError("no spec formula for a layer with a parallel SSM branch (falcon_h1): the "
                                  "Mamba-2 kind has none yet (harness/kinds/recurrent/spec.py)")
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
    # project_qkv: weights only, of the row times falcon_h1's attention_in_multiplier
    # (HF FalconH1DecoderLayer.forward: self_attn(hidden_states * attention_in_multiplier))
    ai = a * cfg.attn_in_multiplier
    q = ai @ w["wq"].T
    # a kv_source layer: placeholders the source's rows replace after RoPE (nothing of them is reported)
    k, v = (ai @ w["wk"].T, ai @ w["wv"].T) if kv is None else (np.zeros((n, Hkv * D)), np.zeros((n, Hkv * Dv)))
    gate = None
    if cfg.q_gate_interleaved:  # split_interleaved_q_gate: per head [q(D) | gate(D)]
        qg = q.reshape(n, H, 2 * D)
        q, gate = qg[..., :D].reshape(n, H * D), qg[..., D:].reshape(n, H * D)
        if "bq_gate" in w:
            gate = gate + w["bq_gate"]
    # apply_qkv_bias_and_clamp, at the widths after the split
    q = q + w.get("bq", 0.0)
    k = (k + w.get("bk", 0.0)) * cfg.key_multiplier  # HF FalconH1Attention: k_proj(h) * key_multiplier
    v = v + w.get("bv", 0.0)
    if cfg.qkv_clamp is not None and cfg.qkv_clamp_at == "bias":
        q, k, v = (np.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k, v))
    q, k, v = q.reshape(n, H, D), k.reshape(n, Hkv, D), v.reshape(n, Hkv, Dv)
    P.update(q=q) if kv is not None else P.update(q=q, k=k, v=v)

    def qk_norm(q, k):
        s = cfg.qk_norm
        if s.over == "head":
            # per_head: q_norm [H, D] -- head h's own row of weights, one head at a time
            if s.per_head:
                return (np.stack([norm(q[:, h], s.norm, _row(w, "q_norm", h), _row(w, "q_norm_b", h))
                                  for h in range(H)], axis=1),
                        np.stack([norm(k[:, h], s.norm, _row(w, "k_norm", h), _row(w, "k_norm_b", h))
                                  for h in range(Hkv)], axis=1))
            return (norm(q, s.norm, w.get("q_norm"), w.get("q_norm_b")),
                    norm(k, s.norm, w.get("k_norm"), w.get("k_norm_b")))
        return (norm(q.reshape(n, -1), s.norm, w.get("q_norm"), w.get("q_norm_b")).reshape(q.shape),
                norm(k.reshape(n, -1), s.norm, w.get("k_norm"), w.get("k_norm_b")).reshape(k.shape))

    pos = np.arange(n)
    if cfg.qk_norm is not None and cfg.qk_norm.where == "pre_rope":
        q, k = qk_norm(q, k)
    if cfg.qkv_clamp is not None and cfg.qkv_clamp_at == "qk_norm":  # HF OlmoeAttention: norm, then clamp
        q, k, v = (np.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k, v))
    if cfg.v_norm is not None:  # HF Gemma3nTextAttention: v_norm per head, no weight
        v = norm(v, cfg.v_norm)
    if cfg.rope is not None:
        f, r = np.array(cfg.rope.inv_freq), cfg.rope.rotary_dim
        if cfg.rope.freq_factors is not None:  # ggml_rope_ext freq_factors: theta_i / ff_i (LongRoPE)
            f = f / np.array(cfg.rope.freq_factors)
        q = rope(q, pos, f, cfg.rope.layout, r)
        k = rope(k, pos, f, cfg.rope.layout, r)
        # apply_rope_attn_factor: YaRN's mscale on the rotated channels
        q[..., :r] *= cfg.rope.attention_factor
        k[..., :r] *= cfg.rope.attention_factor
    if cfg.qk_norm is not None and cfg.qk_norm.where == "post_rope":
        q, k = qk_norm(q, k)
    if cfg.temperature is not None:
        t = cfg.temperature
        q = q * (np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1)[:, None, None]
    if kv is not None:
        k, v = kv  # the source's cached rows (K normed and rotated, V normed)
        P.update(q_rope=q)
    else:
        P.update(q_rope=q, k_rope=k)
    cache = (k, v)
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
        g = a @ w["wg"].T + w.get("bg", 0.0)
        g = np.logaddexp(0.0, g) if cfg.output_gate_fn == "softplus" else sig(g)  # softplus: log(1 + e^g)
        if cfg.output_gate_per_head:  # one scalar per head, over its Dv channels
            g = np.repeat(g, Dv, axis=1)
        b = b * g
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
    o = o * cfg.attn_out_multiplier  # HF FalconH1DecoderLayer: the attention's output * attention_out_multiplier
    P["attn_out"] = o
    if cfg.residual == "sequential":
        # HF MiniMaxDecoderLayer: the residual is the normed input times alpha (residual_base)
        base = a if cfg.residual_base == "normed" else x
        P["resid_mid"] = base * cfg.residual_alpha + o * cfg.residual_multiplier
    return (P, cache) if want_kv else P


def _row(w: dict, name: str, h: int):
    """Head ``h``'s row of a per-head weight ``[heads, D]`` (None where it is absent)."""
    t = w.get(name)
    return None if t is None else t[h]


# ----------------------------------------------------------------- MLA
