"""Mutants of issue 9's position decorations (features III, second half): ALiBi
(bloom, and mpt's 6 heads for the slopes of a head count that is not a power
of two), llama4's chunked windows, attention temperature, the QK norm after
RoPE and its NoPE layer -- each in the family that brings it.

The HF-only llama4 configs are the ones the family module documents: llama.cpp
hard-codes chunk 8192 and temperature floor 8192 (inert at 16 tokens), so the
chunk and temperature mutants run against HF with a tiny chunk / floor."""

from ...mutant import Mutant

ALIBI_NOTE = ("HF computes ALiBi in the model's forward (bloom: _get_alibi_slopes; mpt: build_mpt_alibi_tensor, "
              "ignoring attn_config.alibi); no config, weight or module switch removes it: listed as unswitchable")
LLAMA4_CHUNK = {"family": "llama4", "overrides": (("attention_chunk_size", 6),)}
LLAMA4_TEMP = {"family": "llama4", "overrides": (("floor_scale", 2), ("attn_scale", 0.5))}

MUTANTS = [
    Mutant("alibi-slope-sign", "alibi", "impl.attention",
           "rel = be.asarray((k_pos[None, :] - q_pos[:, None]).astype(np.float64), acc)",
           "rel = be.asarray((q_pos[:, None] - k_pos[None, :]).astype(np.float64), acc)",
           {"family": "bloom"}, "attn_probs", doc="ALiBi rewards distance instead of penalising it",
           bisect_note=ALIBI_NOTE),
    Mutant("alibi-slopes-pow2-rule", "alibi", "impl.config",
           "return [m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_heads)]",
           "return [2.0 ** (-max_bias * (h + 1) / n_heads) for h in range(n_heads)]",
           {"family": "mpt"}, "attn_probs",
           doc="the power-of-two slope rule 2^(-8(h+1)/n) applied to 6 heads (exact for 4 heads: bloom's default passes)",
           bisect_note=ALIBI_NOTE),
    Mutant("chunk-start-off-by-one", "chunked_window", "impl.config",
           "return (q_pos // window.size) * window.size", "return (q_pos // window.size) * window.size - 1",
           LLAMA4_CHUNK, "attn_probs", doc="a chunk also reads the last key of the previous chunk"),
    Mutant("chunk-window-after-push", "chunked_window", "impl.attention",
           "visible &= k_pos[None, :] >= lowest_visible(window, q_pos)[:, None]",
           "visible &= k_pos[None, :] >= lowest_visible(window, q_pos + 1)[:, None]",
           LLAMA4_CHUNK, "attn_probs",
           doc="the window is taken from the position after the push, not the query's own "
               "(spec layer_window_for_query): a chunk's last query sees the next chunk's window"),
    Mutant("temperature-position-off-by-one", "temperature", "impl.attention",
           "scales = np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1.0",
           "scales = np.log1p(np.floor((pos + 1 - t.offset) / t.floor_scale)) * t.attn_scale + 1.0",
           LLAMA4_TEMP, "q_rope", layer=3, doc="temperature floor((pos + 1) / F) read as floor(pos / F)"),
    Mutant("temperature-from-call-index", "temperature", "impl.attention",
           "scales = np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1.0",
           "scales = np.log1p(np.floor((pos - pos[0] + t.offset) / t.floor_scale)) * t.attn_scale + 1.0",
           LLAMA4_TEMP, "q_rope", layer=3,
           doc="temperature from the row's index in this call, not its position (right for prefill only)"),
    Mutant("temperature-offset-of-llama4", "temperature_no_offset", "impl.attention",
           "scales = np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1.0",
           "scales = np.log1p(np.floor((pos + 1) / t.floor_scale)) * t.attn_scale + 1.0",
           {"family": "ministral3"}, "q_rope",
           doc="ministral3's temperature floor(pos / s) read with llama4's offset, floor((pos + 1) / s) (HF "
               "Ministral3 get_llama_4_attn_scale; llama.cpp mistral3 f_attn_temp_offset = 0): one position "
               "early at every step of the floor"),
    Mutant("post-rope-norm-skips-k", "qk_norm_post_rope", "impl.attention",
           'if cfg.qk_norm is not None and cfg.qk_norm.where == "post_rope":\n        q, k = _qk_norm(layer, q, k)',
           'if cfg.qk_norm is not None and cfg.qk_norm.where == "post_rope":\n        q, _ = _qk_norm(layer, q, k)',
           {"family": "llama4"}, "k_rope", doc="llama4's L2 norm after RoPE reaches Q but not K"),
    Mutant("nope-layer-rotated-llama4", "nope_layers", "impl.attention",
           "rope = cfg.rope  #", 'rope = cfg.rope or ropemod.make_rope("default", 10000.0, d)  #',
           {"family": "llama4"}, "q_rope", layer=3, doc="llama4's NoPE layer 3 is rotated with a default RoPE"),
]
