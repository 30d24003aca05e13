"""Mutants of issue 26's decorations (the L list): the temperature without
llama4's +1 offset (ministral3), LongRoPE's factor sets (phi3), QK norms with a
weight per head (stablelm, command-r) and with a bias (phi), the clamp after the
QK norm (olmoe), a softplus output gate of one scalar per head (laguna), V norm
(gemma3n) -- each broken in impl's one body.

``MUTANTS`` are caught by the matrix in the family that brings the decoration,
at the probe where the break first acts (gemma3n's V norm and KV sharing:
smoke's gemma3n cases). ``SPEC_MUTANTS`` break decorations whose reference
family is not in this project (olmoe's clamp after the norm is the S list's
family): each is caught by the spec's own formula
(harness/kinds/attention/spec.py) on the tests/test_kernels.py case named in
``SPEC_CASES``; ``v-norm-dropped`` is also killed there."""

from ...mutant import Mutant

PHI3 = {"family": "phi3"}
PHI3_LONG = {"family": "phi3", "overrides": (("original_max_position_embeddings", 8),)}

STABLELM = {"family": "stablelm"}
GEMMA4 = {"family": "gemma4"}
GEMMA3N = {"family": "gemma3n"}
# HF-only: llama.cpp's phi2 graph has no QK norm slot (the export refuses the tensors)
PHI_QK = {"family": "phi", "ref": "hf", "overrides": (("qk_layernorm", True),)}

MUTANTS: list[Mutant] = [
    # --- QK norms with a weight per head (stablelm; command-r at >= 64 layers) ---
    Mutant("qk-norm-heads-reversed", "qk_norm_per_head_weight", "impl.attention",
           'normalize(xp, q, spec.norm, w.get("q_norm"), w.get("q_norm_b"), be.acc_dtype),',
           'normalize(xp, q, spec.norm, xp.flip(w["q_norm"], axis=0) if spec.per_head else w.get("q_norm"), '
           'w.get("q_norm_b"), be.acc_dtype),',
           STABLELM, "q_rope",
           doc="head h normalised with head n-1-h's weight row (HF StableLmLayerNormPerHead: norms[h] on head h; "
               "llama.cpp attn_q_norm {head_dim, n_head}: row h)"),
    Mutant("qk-norm-per-head-weight-of-head-0", "qk_norm_per_head_weight", "impl.attention",
           'normalize(xp, k, spec.norm, w.get("k_norm"), w.get("k_norm_b"), be.acc_dtype),',
           'normalize(xp, k, spec.norm, w["k_norm"][0] if spec.per_head else w.get("k_norm"), '
           'w.get("k_norm_b"), be.acc_dtype),',
           STABLELM, "k_rope",
           doc="every K head takes head 0's weight (the shared-weight rule of qwen3's QK norm)"),
    # --- a LayerNorm QK norm with a bias (phi qk_layernorm) ---
    Mutant("qk-norm-bias-dropped", "qk_norm_bias", "impl.attention",
           'normalize(xp, q, spec.norm, w.get("q_norm"), w.get("q_norm_b"), be.acc_dtype),',
           'normalize(xp, q, spec.norm, w.get("q_norm"), None, be.acc_dtype),',
           PHI_QK, "q_rope",
           doc="the Q norm's bias is never added (HF PhiAttention: q_layernorm = nn.LayerNorm(head_dim), "
               "elementwise_affine: weight and bias)"),
    # --- LongRoPE (phi3): the factor set divides each pair's band ---
    Mutant("longrope-factors-multiply", "longrope", "impl.rope",
           "freq = freq / np.asarray(spec.freq_factors, dtype=np.float64)",
           "freq = freq * np.asarray(spec.freq_factors, dtype=np.float64)",
           PHI3, "q_rope",
           doc="the factor set multiplies the bands instead of dividing them (HF _compute_longrope_parameters: "
               "1 / (ext_factors * base ** (2i / d)); ggml_rope_ext: theta / freq_factors)"),
    Mutant("longrope-factors-reversed", "longrope", "impl.rope",
           "freq = freq / np.asarray(spec.freq_factors, dtype=np.float64)",
           "freq = freq / np.asarray(spec.freq_factors[::-1], dtype=np.float64)",
           PHI3_LONG, "q_rope",
           doc="the long factor set read from the wrong end: pair i divided by the factor of pair n-1-i"),
]

# proportional RoPE (gemma4's global layers): the engines' classic misreading, the exponent over
# the turned pairs alone (base^(-2i / rotary_dim), ordinary partial rotary's table) instead of
# over the whole head -- the turned pairs spin faster
MUTANTS.append(
    Mutant("proportional-exponent-over-turned-pairs", "rope_proportional", "impl.rope",
           "turned = int(float(params.get(\"partial_rotary_factor\", 1.0)) * rotary_dim // 2)\n"
           "        inv = base_inv.copy()",
           "turned = int(float(params.get(\"partial_rotary_factor\", 1.0)) * rotary_dim // 2)\n"
           "        inv = np.concatenate([1.0 / (float(theta) ** (np.arange(0, 2 * turned, 2) / (2 * turned))), "
           "np.zeros(rotary_dim // 2 - turned)])",
           GEMMA4, "q_rope",
           doc="the turned pairs' bands computed over 2 * turned channels (partial rotary's base^(-2i / rot)), "
               "not over the whole head (HF _compute_proportional_rope_parameters: exponent / head_dim; "
               "llama.cpp n_rot = head_dim with rope_freqs 1e30 on the still pairs)"))

# V norm (gemma3n): killed on smoke's gemma3n cases, and by the spec's formula (SPEC_CASES)
V_NORM_DROPPED = Mutant("v-norm-dropped", "v_norm", "impl.attention",
                        "v = normalize(xp, v, cfg.v_norm, None, None, be.acc_dtype)", "v = v",
                        GEMMA3N, "attn_heads", doc="V reaches the cache un-normed (HF Gemma3nTextAttention.v_norm)")

_CLAMP_AT_BIAS = 'if cfg.qkv_clamp is not None and cfg.qkv_clamp_at == "bias":'

SPEC_MUTANTS = [
    Mutant("clamp-before-qk-norm", "qkv_clamp_after_qk_norm", "impl.attention",
           _CLAMP_AT_BIAS, 'if cfg.qkv_clamp is not None:',
           {}, "q",
           doc="the clamp also acts at the bias, before the QK norm (olmo's place): the norm then reads clamped "
               "rows (HF OlmoeAttention.forward clamps q_norm's output)"),
    Mutant("clamp-after-qk-norm-skips-v", "qkv_clamp_after_qk_norm", "impl.attention",
           "q, k, v = (xp.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k, v))",
           "q, k = (xp.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k))",
           {}, "attn_heads", doc="after the QK norm only q and k are clamped; HF OlmoeAttention clamps v too"),
    V_NORM_DROPPED,
]


# the tests/test_kernels.py CASES each SPEC_MUTANT is judged on
SPEC_CASES = {
    "clamp-before-qk-norm": "qk-norm-then-clamp-v-norm",
    "clamp-after-qk-norm-skips-v": "qk-norm-then-clamp-v-norm",
    "v-norm-dropped": "qk-norm-then-clamp-v-norm",
}

# KV shared across layers (LayerConfig.kv_source; gemma3n's last layers read an earlier
# layer's cache): killed on smoke's gemma3n cases at the reading layer (the tiny config's
# layer 20, reading 18), and by the spec's formula over the source's own cached rows, in
# every KV backing (tests/test_kv_source.py), at its ``first_probe``.
KV_SOURCE_MUTANTS = [
    Mutant("kv-shared-projects-own-rows", "kv_shared", "impl.runner",
           "push(src_layer, src_steps[s], be.asarray(src_inputs[s][start : start + size]), size, pos, None)",
           "push(src_layer, src_steps[s], x, size, pos, None)",
           GEMMA3N, "attn_probs", layer=20,
           doc="the shared layer's K/V projected from ITS OWN input (with the source's projections) instead of "
               "read from the source layer's cache (HF Gemma3nTextAttention: shared_kv_states[layer_type], "
               "stored by the source; gemma3n.cpp: build_attn(.., nullptr, nullptr, ..) on the reused cache)"),
    Mutant("kv-shared-query-after-source-push", "kv_shared", "impl.runner",
           "steps[s].pos = kvmod.query_start(src_steps[s]) if pos is None else pos",
           "steps[s].pos = (kvmod.query_start(src_steps[s]) if pos is None else pos) + size",
           GEMMA3N, "q_rope", layer=20,
           doc="the reader's query positions taken from the shared cache's length AFTER the source's push of "
               "the same call: its rows rotate and mask one call's rows too far on"),
]

MUTANTS += [V_NORM_DROPPED, *KV_SOURCE_MUTANTS]
