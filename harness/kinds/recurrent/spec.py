"""The recurrence's own formula, in float64, written plainly and independently of
impl's body (``impl.recurrent``): one token at a time, one head at a time, the
state a plain ``[Dk, Dv]`` matrix per value head, the causal conv a dot product
over an explicit window of rows. It mirrors what the references compute (HF
``torch_recurrent_gated_delta_rule`` / ``recurrent_kimi_delta_attention``, the
per-token form both their decode paths take; ggml-cpu ``gated_delta_net`` and
``ssm_conv``; HF ``Lfm2ShortConv.forward``), not impl's vectorisation or its
chunked form, and it reads the description (``contract.recurrent``: which
decorations a layer has) and nothing else of impl.

``recurrent_layer`` returns the canonical per-token probes of one sequence in
one call (``contract.probes``); the state probes, which are per call of a
schedule, are not part of a single-call formula.
"""

from __future__ import annotations

import numpy as np

from ...specref import norm, rms, sig

SUPPORTED = ("gated_delta_net", "kimi_delta", "short_conv")


def softplus(x):
    """log(1 + e^x), and x itself above 20 (torch F.softplus's threshold, ggml_softplus)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def silu(x):
    return x * sig(x)


def causal_conv(rows, kernel, bias=None):
    """``out[t, c] = sum_j kernel[c, j] * rows[t - (K-1) + j, c]``, rows before the
    first one zero (HF ``causal_conv1d_fn``: ``F.conv1d(padding=K-1)[..., :T]``)."""
    n, c = rows.shape
    k = kernel.shape[1]
    out = np.zeros((n, c))
    for t in range(n):
        for j in range(k):
            src = t - (k - 1) + j
            if src >= 0:
                out[t] += kernel[:, j] * rows[src]
    return out + (0.0 if bias is None else bias)


def recurrent_layer(cfg, w: dict, x: np.ndarray) -> dict:
    """One recurrent layer over ``x[n, hidden]`` in one call from a zero state."""
    if cfg.kind not in SUPPORTED:
        raise NotImplementedError(f"no spec formula for a {cfg.kind} layer yet (the SSM kinds come with the next "
                                  f"issue); written for: {', '.join(SUPPORTED)}")
    n = x.shape[0]
    a = norm(x, cfg.input_norm, w.get("attn_norm"), w.get("attn_norm_b"))

    def lin(v, name, bias=None):
        return v @ w[name].T + (0.0 if bias is None or bias not in w else w[bias])

    P = {"layer_in": x, "attn_in": a}
    if cfg.kind == "short_conv":
        # HF Lfm2ShortConv.forward: B, C, x = in_proj(x).chunk(3); conv(B * x); y = C * conv
        bx = lin(a, "w_bx", "b_bx") * lin(a, "w_in", "b_in")
        conv = causal_conv(bx, w["conv"], w.get("conv_b"))
        c = lin(a, "w_z", "b_z")
        branch = c * conv
        P.update(rec_conv_in=bx, rec_conv=conv, rec_z=c, attn_branch=branch)
    else:
        hk, hv, dk, dv = cfg.n_k_heads, cfg.n_v_heads, cfg.k_dim, cfg.v_dim
        mixed = lin(a, "w_in", "b_in")
        conv = silu(causal_conv(mixed, w["conv"], w.get("conv_b")))
        q = conv[:, : hk * dk].reshape(n, hk, dk)
        k = conv[:, hk * dk: 2 * hk * dk].reshape(n, hk, dk)
        v = conv[:, 2 * hk * dk:].reshape(n, hv, dv)
        if cfg.qk_norm == "l2":  # x / sqrt(sum x^2 + eps)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + cfg.qk_norm_eps)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + cfg.qk_norm_eps)
        beta = sig(a @ w["w_beta"].T)  # [n, Hv]
        a_in = a if "w_decay_a" not in w else a @ w["w_decay_a"].T
        pre = a_in @ w["w_decay"].T + w["dt_bias"]
        A = -np.exp(w["A_log"])  # [Hv]
        if cfg.kind == "kimi_delta":  # per key channel: [n, Hv, Dk]
            g = softplus(pre).reshape(n, hv, dk) * A[None, :, None]
        else:  # per head: [n, Hv]
            g = softplus(pre) * A[None, :]
        scale = (dk**-0.5) if cfg.q_scale is None else cfg.q_scale
        # value head h reads key head h // (Hv / Hk) (grouped) or h % Hk (tiled)
        src = [h // (hv // hk) if cfg.head_map == "grouped" else h % hk for h in range(hv)]
        y = np.zeros((n, hv, dv))
        for h in range(hv):
            S = np.zeros((dk, dv))
            for t in range(n):
                decay = np.exp(g[t, h])  # a scalar, or one factor per key channel (S's rows)
                S = S * (decay[:, None] if np.ndim(decay) else decay)
                kt, qt = k[t, src[h]], q[t, src[h]] * scale
                u = beta[t, h] * (v[t, h] - S.T @ kt)  # the delta rule
                S = S + np.outer(kt, u)
                y[t, h] = S.T @ qt
        z_in = a if "w_z_a" not in w else a @ w["w_z_a"].T
        z = lin(z_in, "w_z", "b_z").reshape(n, hv, dv)
        gate = silu(z) if cfg.gate_act == "silu" else sig(z)
        # per head: rms(y) * w, then times the gate (HF Qwen3NextRMSNormGated, KimiLinearRMSNormGated)
        normed = rms(y, w["out_norm"], cfg.out_norm_eps)
        branch = (normed * gate).reshape(n, hv * dv)
        P.update(rec_conv_in=mixed, rec_conv=conv, rec_z=z, rec_q=q, rec_k=k, rec_v=v, rec_beta=beta, rec_decay=g,
                 rec_out=y, attn_branch=branch)
    out = P["attn_branch"] @ w["wo"].T + w.get("bo", 0.0)
    P["attn_out"] = out
    base = a if cfg.residual == "normed" else x
    P["resid_mid"] = base * cfg.residual_alpha + out * cfg.residual_beta
    return P
