"""The MLA kind: ``contract.layers.MlaConfig`` layers (DeepSeek-style latent
attention, ``spec/mla.rs.txt``: low-rank or direct Q, the naive combined
``kv_b`` and the absorbed split ``k_b``/``v_b`` forms, interleaved RoPE with
YaRN, the sigmoid output gate).

impl's body is ``impl.mla.mla_block``; its spec formula
``harness/kinds/mla/spec.py``; its mutants ``harness/kinds/mla/mutants.py``.
"""

from __future__ import annotations

from contract.layers import MlaConfig

from .. import LayerKind
from .spec import mla_layer
from .fuzz import spec_strategy, spec_weights

DECORATIONS = {
    "mla": ("multi-head latent attention", "mla.rs: mla_forward_token"),
    "mla_absorbed": ("MLA absorbed (split k_b/v_b) form", "mla.rs: MlaKvB::Split"),
    "mla_naive": ("MLA naive (combined kv_b) form", "mla.rs: MlaKvB::Combined"),
    "mla_low_rank_q": ("MLA low-rank Q (q_a, norm, q_b)", "mla.rs: MlaQProj"),
    "mla_rope": ("MLA decoupled RoPE (interleaved; rotate-half in MiniCPM3)", "mla.rs: rotate_pe"),
    "mla_yarn": ("MLA YaRN (bands, magnitude, kq_scale)", "mla.rs: mla_yarn"),
    "mla_gate": ("MLA sigmoid output gate", "mla.rs: g_proj"),
    # MiniCPM3's MLA (HF modeling_minicpm3.py, llama.cpp minicpm3.cpp): beyond the spec's
    # mla.rs, whose rotate_pe is interleaved at plain / YaRN bands and whose residual adds 1x
    # (its rotate-half layout is a RopeSpec layout of mla_rope, not a decoration of its own)
    "mla_longrope": ("MLA LongRoPE factor set on the decoupled slices (MiniCPM3)",
                     "not in mla.rs: minicpm3.cpp rope_factors"),
    "mla_residual_multiplier": ("MLA branch times a residual multiplier (MiniCPM3 scale_depth / sqrt(L))",
                                "not in mla.rs: minicpm3.cpp scale_res"),
    # Mistral Small 4's MLA (HF modeling_mistral4.py Mistral4Attention.forward): the query
    # times get_llama_4_attn_scale after RoPE; llama.cpp deepseek2.cpp Qcur_attn_temp_scaled
    "mla_temperature": ("MLA query temperature 1 + beta log(1 + floor(pos / original context)) (Mistral 4)",
                        "not in mla.rs: deepseek2.cpp inp_attn_scale"),
}

REFERENCE_GAPS = {
    "mla_gate": "only Kimi K3 has MLA's sigmoid output gate (llama.cpp kimi-k3.cpp); HF transformers has no "
                "Kimi K3 model; checked against the spec's formula in tests/test_mla.py",
}


class Mla(LayerKind):
    description = MlaConfig
    decorations = DECORATIONS
    reference_gaps = REFERENCE_GAPS
    # the decoupled rope slice is the first probe past MLA's RoPE
    rope_probe = "q_pe"
    mutant_modules = ("harness.kinds.mla.mutants",)

    def features(self, lc, weights=None) -> set[str]:
        """The MLA feature tags that are ON for this layer."""
        f = {"mla", f"mla_{lc.form}"}
        if lc.q_lora_rank is not None:
            f.add("mla_low_rank_q")
        if lc.rope is not None:
            f.add("mla_rope")
            if lc.yarn is not None:
                f.add("mla_yarn")
            if lc.rope.kind == "longrope":
                f.add("mla_longrope")
        if lc.residual_multiplier != 1.0:
            f.add("mla_residual_multiplier")
        if lc.use_output_gate:
            f.add("mla_gate")
        if lc.temperature is not None:
            f.add("mla_temperature")
        return f

    def dims(self, lc):
        """Per-head keys in the naive form, one latent row in the absorbed."""
        d = int(lc.qk_nope_head_dim + lc.qk_rope_head_dim)
        return (int(lc.hidden_size), int(lc.n_heads), int(lc.n_heads),
                max(d, int(lc.kv_lora_rank) + int(lc.qk_rope_head_dim)), int(lc.v_head_dim))

    def spec_strategy(self, st, n: int, hid: int, opts: dict):
        return spec_strategy(st, n, hid, opts)

    def spec_weights(self, desc, opts: dict, rng) -> dict:
        return spec_weights(desc, opts, rng)

    def spec_layer(self, desc, weights, x):
        return mla_layer(desc, weights, x)
