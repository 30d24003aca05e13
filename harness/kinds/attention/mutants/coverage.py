"""Mutants of decorations the families exercise that had none yet: partial
rotary (the pass-through channels of a head that rotates only its leading
ones) and a V head width other than the K width -- each a plausible engine bug
that is invisible in the common case (full rotary; V as wide as K) and caught
where the decoration is on.

Decorations still without a mutant, and why: ``mqa`` shares the GQA head map
(a KV head per query-head group; one group is the same code); ``per_layer_heads``
has no code of its own in impl (each layer is built from its own config);
``parallel_residual`` changes only what the attention half does NOT report
(``resid_mid`` is absent for a parallel block, and the next layer is
teacher-forced), so no probe can show a mutant of it."""

from ...mutant import Mutant

# decorations the families exercise that no mutant breaks, and why (see above)
NO_MUTANT = {
    "mqa": "the GQA head map with one group: no code of its own",
    "per_layer_heads": "no code of its own in impl: each layer is built from its own config",
    "parallel_residual": "no probe shows it: resid_mid is absent for a parallel block, the next layer teacher-forced",
    # the recurrent kinds' shape tags name a whole body, whose parts each have a mutant under their own tag
    # (harness/kinds/recurrent/mutants.py; a Mutant carries one decoration)
    "gated_delta_net": "the shape tag of qwen3_next's body: broken by recurrent-decay-sign (log_decay), "
                       "recurrent-l2-norm-dropped (qk_l2_norm), recurrent-state-not-carried (recurrent_state)",
    "kimi_delta": "the shape tag of kimi_linear's body: broken by recurrent-beta-not-squashed (beta_gate), "
                  "which runs on kimi_linear",
    "short_conv": "the shape tag of lfm2's body: broken by recurrent-conv-state-shifted (causal_conv), "
                  "which runs on lfm2",
}

MUTANTS = [
    Mutant("partial-rotary-pairs-from-tail", "partial_rotary", "impl.rope",
           "x1, x2 = x[..., :half], x[..., half:rotary_dim]", "x1, x2 = x[..., :half], x[..., -half:]",
           {"family": "qwen3_next"}, "q_rope",
           doc="rotate-half pairs channel i with the LAST half of the head instead of channel i + rotary_dim / 2: "
               "the same for a fully rotated head, wrong when only the leading rotary_dim channels rotate"),
    Mutant("scale-from-v-width", "v_head_dim", "impl.config",
           "return cfg.head_dim**-0.5 if cfg.scale is None else cfg.scale",
           "return cfg.dv**-0.5 if cfg.scale is None else cfg.scale",
           {"family": "mimo_v2_flash"}, "attn_probs",
           doc="the default softmax scale taken from the V head width instead of the Q/K width: the same when "
               "V is as wide as K (HF MiMoV2FlashAttention: scaling = head_dim ** -0.5)"),
    Mutant("absent-layer-adds-its-input", "absent_layer", "impl.attention",
           'put("resid_mid", x)\n        return None, x', 'x = x + x\n        put("resid_mid", x)\n        return None, x',
           {"family": "nemotron_h"}, "resid_mid", layer=2,
           doc="a layer without attention adds its own input as the branch (residual 2x) instead of passing "
               "the residual through: nemotron_h's MLP layers (HF NemotronHBlock: residual + mlp(norm(x)), "
               "nothing before the MLP)",
           bisect_note="no switch turns an absent layer into a present one in the seeded model (HF's "
                       "layers_block_type and llama.cpp's per-layer head counts fix the stack): listed as "
                       "unswitchable"),
    # --- the softplus output gate, one scalar per head (laguna) ---
    Mutant("softplus-gate-as-sigmoid", "softplus_gate", "impl.attention",
           "g = _softplus(xp, g, be.acc_dtype)", "g = _sigmoid(xp, g)",
           {"family": "laguna"}, "attn_branch",
           doc="the output gate squashed by sigmoid (afmoe's, qwen3_next's) where laguna's is softplus "
               "(HF LagunaAttention.forward: F.softplus(g_proj(hidden_states).float()); laguna.cpp ggml_softplus): "
               "the heads agree, the gated branch does not",
           bisect_note="HF LagunaAttention always gates (softplus of g_proj, modeling_laguna.py:401; no config "
                       "turns it off), so no switch takes the gate away on the reference side: listed as "
                       "unswitchable"),
    Mutant("per-head-gate-strided", "output_gate_per_head", "impl.attention",
           "g = xp.reshape(xp.broadcast_to(xp.reshape(g, (n, h, 1)), (n, h, dv)), (n, h * dv))",
           "g = xp.reshape(xp.broadcast_to(xp.reshape(g, (n, 1, h)), (n, dv, h)), (n, h * dv))",
           {"family": "laguna"}, "attn_branch",
           doc="the per-head gate spread head-minor: channel c takes head c % n_heads's scalar instead of head "
               "c // head_dim's (HF LagunaAttention.forward: view(..., -1, head_dim) * gate.unsqueeze(-1); "
               "laguna.cpp reshapes the gate to [1, n_head, T] against [head_dim, n_head, T])",
           bisect_note="HF LagunaAttention always gates (softplus of g_proj, modeling_laguna.py:401; no config "
                       "turns it off), so no switch takes the gate away on the reference side: listed as "
                       "unswitchable"),
]
