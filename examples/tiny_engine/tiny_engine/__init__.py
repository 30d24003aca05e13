"""A tiny attention engine, written from scratch in NumPy (no code of the
harness or of impl): the attention half of a llama-style decoder layer --
RMS input norm, Q/K/V projections with optional biases, NeoX RoPE, grouped
query attention with a causal softmax, the output projection with an optional
bias, the residual add. It is the example engine of the README's "Testing your
own engine": ``candidate.py`` plugs it into the harness by an entry point, and
``examples/dump_writer.py`` runs it on an exported case and writes a dump.

``layer(cfg, w, x)`` takes one layer's description as plain data (the
``layers`` entries of an exported ``case.json``, or ``dataclasses.asdict`` of
the ``LayerConfig`` the harness hands a candidate), the layer's weights by
impl's names in HF ``nn.Linear`` layout, and one sequence's input rows; it
returns every probe it computes, in the harness's canonical layout.
"""

from __future__ import annotations

import numpy as np

__version__ = "0.1.0"

# what this engine computes; any other decoration is refused, never ignored
PLAIN = {"qkv_clamp": None, "qk_norm": None, "temperature": None, "window": None, "softcap": None,
         "alibi_max_bias": None, "q_gate": None, "sub_norm": None, "o_scale": None, "value_scale": None,
         "post_norm": None, "residual": "sequential", "residual_multiplier": 1.0}
DTYPES = {"float32": np.float32, "float64": np.float64}
KNOWN_WEIGHTS = {"attn_norm", "wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"}


def unsupported(cfg: dict, weights: dict | None = None) -> str | None:
    """Why this engine cannot compute the layer ``cfg`` describes, or None."""
    if cfg.get("shape", "gqa") != "gqa":
        return f"attention shape {cfg.get('shape')!r} (only gqa)"
    if (cfg.get("input_norm") or {}).get("kind") != "rms":
        return f"input norm {(cfg.get('input_norm') or {}).get('kind')!r} (only rms)"
    if "kv_lora_rank" in cfg:
        return "multi-head latent attention"
    for key, plain in PLAIN.items():
        if cfg.get(key, plain) != plain:
            return f"{key} = {cfg[key]!r}"
    if cfg.get("v_head_dim") not in (None, cfg["head_dim"]):
        return "a v_head_dim other than head_dim"
    rope = cfg.get("rope")
    if rope is not None and rope.get("layout") != "neox":
        return f"RoPE layout {rope.get('layout')!r} (only neox)"
    extra = set(weights or {}) - KNOWN_WEIGHTS
    if extra:
        return f"weights {sorted(extra)}"
    return None


def _rope_neox(x, cos, sin, rot: int, bug: str | None):
    """Rotate the first ``rot`` channels of each head: NeoX pairs (i, i + rot/2)."""
    xr, rest = x[..., :rot], x[..., rot:]
    if bug == "rope-interleaved":  # the demo bug: adjacent pairs (GPT-J) instead of halves
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = np.empty_like(xr)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
    else:
        h = rot // 2
        a, b = xr[..., :h], xr[..., h:]
        out = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return np.concatenate([out, rest], axis=-1)


def layer(cfg: dict, w: dict, x: np.ndarray, dtype: str = "float32", bug: str | None = None) -> dict:
    """One layer over one sequence's rows ``x[T, hidden]`` (all rows at once)."""
    why = unsupported(cfg, w)
    if why:
        raise ValueError(f"tiny_engine does not compute {why}")
    dt = DTYPES[dtype]
    x = np.asarray(x, dtype=dt)
    w = {k: np.asarray(v, dtype=dt) for k, v in w.items()}
    T = x.shape[0]
    H, Hkv, D = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    eps = dt(cfg["input_norm"]["eps"])
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    if "attn_norm" in w:
        normed = normed * w["attn_norm"]

    def proj(name, bias):
        y = normed @ w[name].T
        return y + w[bias] if bias in w else y

    q = proj("wq", "bq").reshape(T, H, D)
    k = proj("wk", "bk").reshape(T, Hkv, D)
    v = proj("wv", "bv").reshape(T, Hkv, D)
    out = {"attn_in": normed, "q": q, "k": k, "v": v}
    rope = cfg.get("rope")
    if rope is not None:
        inv = np.asarray(rope["inv_freq"], dtype=np.float64)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        f = rope.get("attention_factor", 1.0)
        cos = (np.cos(ang) * f).astype(dt)[:, None, :]
        sin = (np.sin(ang) * f).astype(dt)[:, None, :]
        q = _rope_neox(q, cos, sin, 2 * inv.size, bug)
        k = _rope_neox(k, cos, sin, 2 * inv.size, bug)
    out["q_rope"], out["k_rope"] = q, k
    scale = dt(cfg["scale"] if cfg.get("scale") is not None else D ** -0.5)
    kh = np.repeat(k, H // Hkv, axis=1)  # query head h reads KV head h // (H / Hkv)
    vh = np.repeat(v, H // Hkv, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, kh) * scale
    causal = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(causal[None], scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    heads = np.einsum("hqk,khd->qhd", probs, vh)
    branch = heads.reshape(T, H * D)
    attn_out = branch @ w["wo"].T
    if "bo" in w:
        attn_out = attn_out + w["bo"]
    out.update(attn_probs=probs, attn_heads=heads, attn_branch=branch, attn_out=attn_out, resid_mid=x + attn_out)
    return out
