"""Mutants of issue 9's decorations (features III): the QKV clamp, the whole-row
QK norm, the post-attention norm, gemma's ``(1 + w)`` norms, per-layer RoPE
theta, an explicit attention scale, NoPE layers, the bias-free LayerNorm and
interleaved RoPE -- each in the family that brings it."""

from ...mutant import Mutant

GEMMA3_HF_SCALE = {"family": "gemma3", "overrides": (("query_pre_attn_scalar", 256),)}

MUTANTS = [
    Mutant("qkv-clamp-upper-bound", "qkv_clamp", "impl.attention",
           "q, k, v = (xp.clip(t, -c, c) for t in (q, k, v))",
           "q, k, v = (xp.clip(t, -c, 1.5 * c) for t in (q, k, v))",
           {"family": "olmo"}, "q", doc="clip_qkv clamps the positive side at 1.5x the bound"),
    Mutant("qk-norm-row-per-head", "qk_norm_row", "impl.attention",
           'qr = normalize(xp, xp.reshape(q, (n, -1)), spec.norm, w.get("q_norm"), w.get("q_norm_b"), be.acc_dtype)',
           'qr = xp.reshape(normalize(xp, q, spec.norm, xp.reshape(w.get("q_norm"), q.shape[1:]), None, '
           'be.acc_dtype), (n, -1))',
           {"family": "olmo2"}, "q_rope",
           doc="olmo2's whole-row Q norm takes its statistics per head (qwen3's rule) with the row weight"),
    Mutant("qk-norm-placement-typo", "qk_norm_head", "impl.attention",
           'if cfg.qk_norm is not None and cfg.qk_norm.where == "pre_rope":',
           'if cfg.qk_norm is not None and cfg.qk_norm.where == "pre-rope":',
           {"family": "gemma3"}, "q_rope", doc="a misspelt placement: gemma3's (1 + w) QK norm is never applied"),
    Mutant("post-norm-reads-input-norm-spec", "post_norm", "impl.attention",
           'out = normalize(xp, out, cfg.post_norm, w.get("post_norm"), w.get("post_norm_b"), be.acc_dtype)',
           'out = normalize(xp, out, cfg.input_norm, w.get("post_norm"), w.get("post_norm_b"), be.acc_dtype)',
           {"family": "olmo2"}, "attn_out",
           doc="the post-attention norm follows the input norm's spec (none for olmo2) instead of its own"),
    Mutant("rms1p-drops-the-one", "rms1p", "impl.norms",
           "return xp.astype(y * (1.0 + w), in_dtype, copy=False)", "return xp.astype(y * w, in_dtype, copy=False)",
           {"family": "gemma3"}, "attn_in", doc="gemma's (1 + w) norm multiplies by w alone"),
    Mutant("rope-theta-ignored", "per_layer_theta", "impl.rope",
           "base_inv = 1.0 / (float(theta) ** exponents)", "base_inv = 1.0 / (10000.0 ** exponents)",
           {"family": "gemma3"}, "q_rope", layer=1,
           doc="every layer rotates with theta 10000: gemma3's local layers (10000) pass, the global ones (1e6) fail"),
    Mutant("explicit-scale-ignored", "attn_scale", "impl.config",
           "return cfg.head_dim**-0.5 if cfg.scale is None else cfg.scale", "return cfg.head_dim**-0.5",
           GEMMA3_HF_SCALE, "attn_probs", doc="query_pre_attn_scalar is dropped for head_dim ** -0.5"),
    Mutant("nope-layer-rotated", "nope_layers", "impl.attention",
           "rope = cfg.rope  #", 'rope = cfg.rope or ropemod.make_rope("default", 10000.0, d)  #',
           {"family": "smollm3"}, "q_rope", layer=3, doc="a NoPE layer is rotated with a default RoPE"),
    Mutant("layernorm-mean-kept", "layernorm", "impl.norms",
           'if spec.kind == "layer":', 'if spec.kind == "layer_":',
           {"family": "cohere2"}, "attn_in", doc="the LayerNorm forgets to subtract the mean (an RMS norm)"),
    Mutant("interleaved-rotation-reversed", "rope_interleaved", "impl.rope",
           "pairs = xp.stack([xe * c - xo * s, xo * c + xe * s], axis=-1)",
           "pairs = xp.stack([xe * c + xo * s, xo * c - xe * s], axis=-1)",
           {"family": "cohere2"}, "q_rope", doc="interleaved pairs rotate the wrong way"),
]
