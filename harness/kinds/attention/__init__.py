"""The attention kind: ``contract.layers.LayerConfig`` layers (GQA with every
decoration of ``spec/attn_block.rs.txt``, and the spec's Linear / Absent shapes).

impl's body is ``impl.attention.attn_block``; its spec formula
``harness/kinds/attention/spec.py``; its mutants ``harness/kinds/attention/mutants/``.
"""

from __future__ import annotations

import numpy as np

from contract.layers import LayerConfig

from .. import LayerKind
from .spec import attn_layer
from .switches import model_switches
from .fuzz import spec_strategy, spec_weights

# tag -> (what it is, where the spec names it)
DECORATIONS = {
    "gqa": ("grouped-query heads (n_kv_heads < n_heads)", "attn_block: AttnShape::Gqa"),
    "mqa": ("one KV head shared by every query head", "attn_block: AttnShape::Gqa"),
    "qkv_bias": ("Q/K/V projection biases", "apply_qkv_bias_and_clamp"),
    "qkv_clamp": ("clamp of Q/K/V (clip_qkv)", "apply_qkv_bias_and_clamp"),
    "qkv_clamp_after_qk_norm": ("the Q/K/V clamp after the QK norm (olmoe clip_qkv)",
                                "(HF OlmoeAttention.forward; the spec clamps after the bias)"),
    "qk_norm_head": ("per-head QK norm before RoPE", "apply_qk_norms_pre_rope"),
    "qk_norm_row": ("whole-row QK norm before RoPE", "apply_qk_norms_pre_rope"),
    "qk_norm_post_rope": ("QK norm after RoPE", "apply_qk_norms_post_rope"),
    "qk_norm_per_head_weight": ("QK norm with one weight per head ([n_heads, head_dim]: stablelm, command-r)",
                                "apply_qk_norms_pre_rope (the weight's shape)"),
    "qk_norm_bias": ("a LayerNorm QK norm with a bias (phi qk_layernorm)", "apply_qk_norms_pre_rope"),
    "v_norm": ("V normalised per head before the cache (gemma3n)", "(HF Gemma3nTextAttention.v_norm)"),
    "kv_shared": ("K/V read from an earlier layer's cache instead of projected (gemma3n's last layers)",
                  "(HF Gemma3nTextAttention.is_kv_shared_layer; gemma3n.cpp !hparams.has_kv(il))"),
    "rope_neox": ("rotate-half RoPE", "apply_rope_head_layer"),
    "rope_interleaved": ("GPT-J interleaved RoPE", "apply_rope_head_layer"),
    "partial_rotary": ("RoPE on the leading channels only", "apply_rope_head_layer"),
    "rope_scaling": ("RoPE frequency scaling (linear / llama3 / YaRN)", "apply_rope_head_layer"),
    "rope_attn_factor": ("RoPE attention factor / YaRN mscale", "apply_rope_attn_factor"),
    "rope_proportional": ("proportional RoPE: the first pairs of the WHOLE head turn at base^(-2i/head_dim), the "
                          "rest stand still (gemma4's global layers)", "apply_rope_head_layer "
                          "(HF _compute_proportional_rope_parameters; ggml_rope_ext freq_factors 1e30)"),
    "longrope": ("LongRoPE: RoPE bands divided pair by pair by a short / long factor set (phi3, minicpm3)",
                 "apply_rope_head_layer (ggml_rope_ext freq_factors)"),
    "per_layer_theta": ("per-layer RoPE theta", "apply_rope_head_layer(layer_idx)"),
    "nope_layers": ("layers without RoPE", "apply_rope_head_layer"),
    "attn_scale": ("attention scale other than head_dim^-0.5", "apply_attention_scale"),
    "temperature": ("per-position attention temperature", "apply_attn_temperature"),
    "temperature_no_offset": ("temperature of floor(pos / s) (ministral3; llama4's is floor((pos + 1) / s))",
                              "apply_attn_temperature (llama.cpp f_attn_temp_offset)"),
    "sliding_window": ("sliding-window attention", "layer_window_for_query"),
    "chunked_window": ("chunked attention windows", "layer_window_for_query"),
    "softcap": ("logit softcap", "push_and_attend_row: softcap"),
    "alibi": ("ALiBi position bias", "push_and_attend_row: alibi_slopes"),
    "sinks": ("attention sinks", "push_and_attend_row: sinks"),
    "q_gate_interleaved": ("interleaved Q gate", "split_interleaved_q_gate / apply_interleaved_gate"),
    "output_gate": ("output gate from a separate projection", "attn_branch_rows: output_gate"),
    "softplus_gate": ("the output gate squashed by softplus (laguna)", "attn_branch_rows: output_gate"),
    "output_gate_per_head": ("an output gate of one scalar per head (laguna gating='per-head')",
                             "attn_branch_rows: output_gate"),
    "sub_norm": ("attention sub-norm before wo", "attn_branch_rows: attn_sub_norm"),
    "o_bias": ("o_proj bias", "project_attn_rows: o_bias"),
    "o_scale": ("wo scale companion", "project_attn_rows: o_scale"),
    "value_scale": ("attention value scale after wo", "project_attn_rows: attn_value_scale"),
    "post_norm": ("post-attention norm", "project_attn_rows: post_attn_norm"),
    "v_head_dim": ("V head width != K head width", "push_and_attend_row: v_head_dim"),
    "per_layer_heads": ("per-layer head counts", "ModelConfig::layer_shape"),
    "absent_layer": ("a layer with no attention", "AttnShape::Absent"),
    "linear_layer": ("a layer whose attention is one linear map", "AttnShape::Linear"),
    "parallel_residual": ("attention and FFN on the same input", "(family residual layout)"),
    "layernorm": ("LayerNorm input norm", "(family input norm)"),
    "rms1p": ("(1 + w) RMS norm convention (gemma) on the input, QK or post norm", "(family norm convention)"),
    "residual_multiplier": ("residual multiplier", "(family residual layout)"),
    "normed_residual": ("the branch added to the NORMED input times alpha, not to the input",
                        "(family residual layout: HF MiniMaxDecoderLayer, minimax-01.cpp f_residual_scale)"),
    "parallel_ssm": ("a Mamba-2 block on the attention's normed row, its output summed with the attention's "
                     "(falcon_h1)", "attn_block: parallel_ssm_rows / add_parallel_ssm"),
    "branch_multipliers": ("the parallel branches' muP scalars: attention_in, key, attention_out, ssm_in, ssm_out "
                           "(falcon_h1)", "(HF FalconH1DecoderLayer / FalconH1Attention; the converter folds them)"),
    "mup_vector": ("the parallel Mamba-2 in_proj's per-segment multipliers of z, x, B, C and dt (falcon_h1 "
                   "ssm_multipliers)", "(HF FalconH1Mixer mup_vector; the converter folds it into in_proj)"),
}

# Decorations of the spec no reference family in this environment has, with the
# reason and what verifies them instead (`conformance features`, summary.md).
REFERENCE_GAPS = {
    "linear_layer": "no HF transformers family has an attention that is one linear map (deci's is remote "
                    "code); checked against a plain float64 formula in tests/test_family_shapes.py",
}


class Attention(LayerKind):
    description = LayerConfig
    decorations = DECORATIONS
    reference_gaps = REFERENCE_GAPS
    rope_probe = "q_rope"
    mutant_modules = tuple(f"harness.kinds.attention.mutants.{m}" for m in (
        "core", "coverage", "features1", "features2", "features3", "features3_alibi_chunk", "features4", "features5", "subtle",
        "engine", "parallel_ssm"))

    def features(self, lc, weights=None) -> set[str]:
        """The tags ON for one layer: read from what impl is told to compute (the
        description and the names of the weights it is handed)."""
        w = weights or {}
        if lc.shape == "absent":
            return {"absent_layer"}
        if lc.shape == "linear":
            return {"linear_layer"}
        f = set()
        if lc.n_kv_heads == 1 and lc.n_heads > 1:
            f.add("mqa")
        elif lc.n_kv_heads < lc.n_heads:
            f.add("gqa")
        if any(k in w for k in ("bq", "bk", "bv")):
            f.add("qkv_bias")
        if lc.qkv_clamp is not None:
            f.add("qkv_clamp_after_qk_norm" if lc.qkv_clamp_at == "qk_norm" else "qkv_clamp")
        if lc.qk_norm is not None:
            f.add("qk_norm_post_rope" if lc.qk_norm.where == "post_rope" else f"qk_norm_{lc.qk_norm.over}")
            if lc.qk_norm.per_head and ("q_norm" in w or "k_norm" in w):
                f.add("qk_norm_per_head_weight")
            if "q_norm_b" in w or "k_norm_b" in w:
                f.add("qk_norm_bias")
        if lc.v_norm is not None:
            f.add("v_norm")
        if lc.kv_source is not None:
            f.add("kv_shared")
        if lc.rope is None:
            f.add("nope_layers")
        else:
            f.add(f"rope_{lc.rope.layout}")
            if lc.rope.rotary_dim < lc.head_dim:
                f.add("partial_rotary")
            if lc.rope.kind == "proportional":
                f.add("rope_proportional")
            elif lc.rope.kind != "default":
                f.add("rope_scaling")
            if lc.rope.attention_factor != 1.0:
                f.add("rope_attn_factor")
            if lc.rope.freq_factors is not None and any(x != 1.0 for x in lc.rope.freq_factors):
                f.add("longrope")
        if lc.scale is not None and not np.isclose(lc.scale, lc.head_dim**-0.5):
            f.add("attn_scale")
        if lc.temperature is not None:
            f.add("temperature" if lc.temperature.offset == 1 else "temperature_no_offset")
        if lc.window is not None:
            f.add("sliding_window" if lc.window.kind == "sliding" else "chunked_window")
        if lc.softcap is not None:
            f.add("softcap")
        if lc.alibi_max_bias is not None:
            f.add("alibi")
        if "sinks" in w:
            f.add("sinks")
        if lc.q_gate_interleaved:
            f.add("q_gate_interleaved")
        if lc.output_gate:
            f.add("output_gate")
            if lc.output_gate_fn == "softplus":
                f.add("softplus_gate")
            if lc.output_gate_per_head:
                f.add("output_gate_per_head")
        if lc.sub_norm is not None:
            f.add("sub_norm")
        if "bo" in w:
            f.add("o_bias")
        if lc.o_scale is not None:
            f.add("o_scale")
        if lc.value_scale is not None:
            f.add("value_scale")
        if lc.post_norm is not None:
            f.add("post_norm")
        if lc.v_head_dim is not None and lc.v_head_dim != lc.head_dim:
            f.add("v_head_dim")
        if lc.residual == "parallel":
            f.add("parallel_residual")
        if lc.input_norm.kind == "layer":
            f.add("layernorm")
        if "rms1p" in {n.kind for n in (lc.input_norm, lc.qk_norm.norm if lc.qk_norm else None, lc.post_norm) if n}:
            f.add("rms1p")
        if lc.residual_multiplier != 1.0:
            f.add("residual_multiplier")
        if lc.residual_base == "normed" or lc.residual_alpha != 1.0:
            f.add("normed_residual")
        if lc.parallel_ssm is not None:
            f.add("parallel_ssm")
            # HF FalconH1Mixer multiplies in_proj's output by mup_vector (its segments z | x | B | C | dt)
            if any(m != 1.0 for m in (lc.parallel_ssm.proj_multipliers or ())):
                f.add("mup_vector")
        if any(m != 1.0 for m in (lc.attn_in_multiplier, lc.key_multiplier, lc.attn_out_multiplier,
                                  lc.ssm_in_multiplier, lc.ssm_out_multiplier)):
            f.add("branch_multipliers")
        return f

    def model_features(self, descs, tags: set[str]) -> set[str]:
        f = set(tags)
        gqa = [lc for lc in descs if lc.shape == "gqa"]
        if len({(lc.n_heads, lc.n_kv_heads, lc.head_dim, lc.dv) for lc in gqa}) > 1:
            f.add("per_layer_heads")
        thetas = {lc.rope.inv_freq for lc in gqa if lc.rope is not None}
        if len(thetas) > 1:
            f.add("per_layer_theta")
        if gqa and not thetas:
            # "nope_layers" is skipping RoPE on the layers a RoPE model names (llama4,
            # smollm3, cohere2); a model with no RoPE anywhere (ALiBi: bloom, mpt) has
            # no such layers to get wrong
            f.discard("nope_layers")
        return f

    def dims(self, lc):
        h = int(lc.n_heads or 0)
        return int(lc.hidden_size), h, int(lc.n_kv_heads or h), int(lc.head_dim or 0), int(lc.dv or 0)

    def spec_strategy(self, st, n: int, hid: int, opts: dict):
        return spec_strategy(st, n, hid, opts)

    def spec_weights(self, desc, opts: dict, rng) -> dict:
        return spec_weights(desc, opts, rng)

    def spec_layer(self, desc, weights, x):
        return attn_layer(desc, weights, x)

    def switches(self, family) -> dict:
        return model_switches(family)
