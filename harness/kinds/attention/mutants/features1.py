"""Mutants of issue 4's decorations (features I): attention sinks, the logit
softcap, the o_proj bias and its place among the scales, the post-attention
norm, the attention scale, YaRN, the residual multiplier and LayerNorm's bias --
each in the family that brings it (gpt_oss, gemma2, granite, starcoder2)."""

# the HF-only configs of the families that bring these decorations, as overrides
O_BIAS = (("attention_bias", True),)  # gemma2 (harness/families/gemma2: O_BIAS)
TRUNCATE_OFF = (("rope_parameters.truncate", False),)  # gpt_oss (harness/families/gpt_oss: TRUNCATE_OFF)
from ...mutant import Mutant

GPT_OSS = {"family": "gpt_oss"}
GEMMA2 = {"family": "gemma2"}
GRANITE = {"family": "granite"}
STARCODER2 = {"family": "starcoder2"}

MUTANTS = [
    # --- sinks (gpt_oss) ---
    Mutant("sink-dropped", "sinks", "impl.attention",
           "probs = e / (xp.sum(e, axis=-1, keepdims=True) + xp.exp(s - m))",
           "probs = e / xp.sum(e, axis=-1, keepdims=True)",
           GPT_OSS, "attn_probs", doc="the sink no longer joins the softmax denominator"),
    Mutant("sink-scaled-like-a-key", "sinks", "impl.attention",
           "s = xp.reshape(xp.astype(sinks, acc), (q.shape[1], 1, 1))",
           "s = xp.reshape(xp.astype(sinks, acc), (q.shape[1], 1, 1)) * scale",
           GPT_OSS, "attn_probs",
           doc="the sink logit is multiplied by the softmax scale, as if it were a q.k score (HF adds it unscaled)"),
    # --- softcap (gemma2) ---
    Mutant("softcap-dropped", "softcap", "impl.attention",
           "if softcap is not None and sinks is None:", "if softcap is not None and sinks is not None:",
           GEMMA2, "attn_probs", doc="the logit softcap is never applied"),
    Mutant("softcap-before-scale", "softcap", "impl.attention",
           "scores = softcap * xp.tanh(scores / softcap)",
           "scores = softcap * xp.tanh(scores / scale / softcap) * scale",
           GEMMA2, "attn_probs", doc="tanh caps the raw q.k and the scale comes after (HF: scale, then cap)"),
    Mutant("softcap-after-mask", "softcap", "impl.attention",
           "neg_inf = xp.asarray(-np.inf, dtype=acc, **_dev(be))",
           "neg_inf = xp.asarray(-softcap if softcap is not None and sinks is None else -np.inf, "
           "dtype=acc, **_dev(be))",
           GEMMA2, "attn_probs",
           doc="the softcap applied after the mask: a masked logit becomes cap * tanh(-inf) = -cap, not -inf, "
               "so masked keys leak probability"),
    # --- o_proj bias and its order (starcoder2, granite, gemma2 + attention_bias) ---
    Mutant("o-bias-dropped", "o_bias", "impl.attention",
           'out = out + w["bo"]', "out = out",
           STARCODER2, "attn_out", doc="the o_proj bias is never added"),
    Mutant("o-bias-after-post-norm", "o_bias", "impl.attention",
           'out = normalize(xp, out, cfg.post_norm, w.get("post_norm"), w.get("post_norm_b"), be.acc_dtype)',
           'out = normalize(xp, out - w["bo"], cfg.post_norm, w.get("post_norm"), w.get("post_norm_b"), '
           'be.acc_dtype) + w["bo"]',
           {"family": "gemma2", "overrides": O_BIAS}, "attn_out",
           doc="the o_proj bias is added after the post-attention norm instead of before it (spec order: "
               "scale, bias, value scale, post-norm)"),
    Mutant("o-bias-escapes-residual-multiplier", "o_bias", "impl.attention",
           "resid = x + branch * cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else x + branch",
           'resid = (x + (branch - layer.w["bo"]) * cfg.residual_multiplier + layer.w["bo"] '
           "if cfg.residual_multiplier != 1.0 else x + branch)",
           GRANITE, "resid_mid",
           doc="granite: the o_proj bias is added after the residual multiplier instead of being scaled "
               "with the branch"),
    # --- post-attention norm (gemma2) ---
    Mutant("post-norm-missing", "post_norm", "impl.attention",
           "if cfg.post_norm is not None:", "if cfg.post_norm is not None and False:",
           GEMMA2, "attn_out", doc="the post-attention norm is skipped"),
    Mutant("post-norm-plain-weight", "post_norm", "impl.attention",
           'out = normalize(xp, out, cfg.post_norm, w.get("post_norm"), w.get("post_norm_b"), be.acc_dtype)',
           'out = normalize(xp, out, type(cfg.post_norm)("rms", cfg.post_norm.eps), w.get("post_norm"), '
           'w.get("post_norm_b"), be.acc_dtype)',
           GEMMA2, "attn_out", doc="gemma2's post-attention norm multiplies by w instead of (1 + w)"),
    # --- attention scale (granite) ---
    Mutant("attn-multiplier-squared", "attn_scale", "impl.config",
           "return cfg.head_dim**-0.5 if cfg.scale is None else cfg.scale",
           "return cfg.head_dim**-0.5 if cfg.scale is None else cfg.scale**2",
           GRANITE, "attn_probs", doc="an explicit scale (granite's attention_multiplier) is applied twice",
           bisect_note="granite's scale is always explicit (LayerConfig.scale = attention_multiplier): switching "
                       "attn_scale off sets it to head_dim^-0.5, explicitly, which the mutant still squares"),
    # --- residual multiplier (granite) ---
    Mutant("residual-multiplier-dropped", "residual_multiplier", "impl.attention",
           "resid = x + branch * cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else x + branch",
           "resid = x + branch",
           GRANITE, "resid_mid", doc="the branch is added to the residual unscaled"),
    # --- the residual from the normed input x alpha (minimax's softmax-attention layer 7) ---
    Mutant("attn-normed-residual-from-input", "normed_residual", "impl.attention",
           'if cfg.residual_base == "normed":', "if False:",
           {"family": "minimax"}, "resid_mid", layer=7,
           doc="the branch is added to the layer's input, not to its normed input times alpha (HF "
               "MiniMaxDecoderLayer `residual = input_layernorm(x)`; minimax-01.cpp residual = attn_norm's output)",
           bisect_note="no switch turns minimax's residual layout off in the seeded model (MiniMaxDecoderLayer "
                       "always adds to the normed input): listed as unswitchable"),
    # --- YaRN (gpt_oss) ---
    Mutant("yarn-truncate-ignored", "rope_scaling", "impl.rope",
           'if p.get("truncate", True):', "if True:",
           {"family": "gpt_oss", "overrides": TRUNCATE_OFF}, "q_rope", dtypes=("float64", "float32"),
           doc="the YaRN correction range is always floored/ceiled (llama.cpp's rule), ignoring truncate=false "
               "(q_rope NMSE 9e-6 on its own case: below bfloat16's own rounding, floor 1e-5 x ratio 4, so it is "
               "scored at float32 and float64 only)"),
    Mutant("yarn-attn-factor-dropped", "rope_attn_factor", "impl.rope",
           "return np.cos(ang) * spec.attention_factor, np.sin(ang) * spec.attention_factor",
           "return np.cos(ang), np.sin(ang)",
           GPT_OSS, "q_rope", doc="YaRN's attention factor (0.1 ln(factor) + 1 on cos and sin) is dropped"),
    # --- LayerNorm with bias (starcoder2) ---
    Mutant("layernorm-bias-dropped", "layernorm", "impl.norms",
           "y = y + bias", "y = y",
           STARCODER2, "attn_in", doc="the input LayerNorm forgets its bias"),
]
