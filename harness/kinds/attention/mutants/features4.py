"""Mutants of the two decorations verified against references last: the OUTPUT
GATE from a separate projection of the normed input (afmoe: HF
``AfmoeAttention.forward``, llama.cpp ``afmoe.cpp`` ``attn_gated``) and the
``wo`` SCALE companion (the llama family's ``wo_scale`` variant: llama.cpp
``build_attn``'s ``build_lora_mm(wo, cur, wo_s)`` THEN ``wo_b``) -- each broken
in impl's one body and caught at the probe where the break first acts."""

from ...mutant import Mutant

AFMOE = {"family": "afmoe"}
WO_SCALE = {"family": "llama", "variant": "wo_scale"}
WO_SCALE_BIAS = {**WO_SCALE, "overrides": (("attention_bias", True),)}

_GATE = 'branch = branch * _output_gate(layer, normed, n)'

# impl.attention: from the separate gate to wo (the gate moves past wo)
_GATE_TO_WO = '''        branch = branch * _output_gate(layer, normed, n)
    if cfg.sub_norm is not None:
        # bitnet.cpp / HF BitNetAttention `attn_sub_norm`: RMS over the concatenated
        # heads of one row, before wo.
        branch = normalize(xp, branch, cfg.sub_norm, w.get("sub_norm"), None, be.acc_dtype)
    put("attn_branch", branch)

    out = _linear(xp, branch, w["wo"], None)
'''

# impl.attention: the wo scale and the bias after it
_SCALE_THEN_BIAS = '''    if cfg.o_scale is not None:
        out = out * cfg.o_scale
    if "bo" in w:
        out = out + w["bo"]
'''

MUTANTS = [
    # --- the output gate (afmoe) ---
    Mutant("output-gate-from-raw-input", "output_gate", "impl.attention",
           _GATE, _GATE.replace("(layer, normed, n)", "(layer, x, n)"),
           AFMOE, "attn_branch",
           doc="the gate projects the raw layer input instead of the normed input q/k/v read "
               "(HF: gate_proj(hidden_states) after input_layernorm; afmoe.cpp: wqkv_gate on attn_norm)"),
    Mutant("output-gate-after-wo", "output_gate", "impl.attention",
           _GATE_TO_WO,
           _GATE_TO_WO.replace(f"        {_GATE}\n", "        pass\n")
           + '    if cfg.output_gate:  # the gate applied to wo\'s output\n'
           + '        out = out * _output_gate(layer, normed, n)\n',
           AFMOE, "attn_branch",
           doc="the sigmoid gate multiplies wo's output instead of the heads entering wo "
               "(hidden_size == n_heads * head_dim in afmoe's tiny config, so the shapes still fit)"),
    Mutant("output-gate-tanh-for-sigmoid", "output_gate", "impl.attention",
           "        g = _sigmoid(xp, g)\n", "        g = xp.tanh(g)\n",
           AFMOE, "attn_branch", doc="the separate gate squashed by tanh instead of the sigmoid"),
    # --- the wo scale companion (llama, variant wo_scale) ---
    Mutant("o-scale-dropped", "o_scale", "impl.attention",
           "out = out * cfg.o_scale", "out = out",
           WO_SCALE, "attn_out",
           doc="the {1} companion of wo is never multiplied in: the stored W / s is used as W"),
    Mutant("o-scale-after-bias", "o_scale", "impl.attention",
           _SCALE_THEN_BIAS,
           '''    if "bo" in w:
        out = out + w["bo"]
    if cfg.o_scale is not None:
        out = out * cfg.o_scale
''',
           WO_SCALE_BIAS, "attn_out",
           doc="the bias is added before the scale (build_attn: build_lora_mm(wo, cur, wo_s), THEN wo_b), "
               "so the bias is scaled too"),
]


# Both gates on one layer (spec attn_branch_rows: the interleaved Q gate, then the
# output gate, then the sub-norm) are in no reference family (qwen3_next has the
# first, afmoe the second, bitnet the sub-norm), so these are not in the
# registry's reference-checked MUTANTS: tests/test_kernels.py checks them against
# the spec's formulas (harness/specref.py), at the probe named here.
_OUTPUT_GATE = '''    if cfg.output_gate:
        # spec `output_gate`: a projection of the SAME normed input the QKV read.
        branch = branch * _output_gate(layer, normed, n)
'''
_SUB_NORM = '''    if cfg.sub_norm is not None:
        # bitnet.cpp / HF BitNetAttention `attn_sub_norm`: RMS over the concatenated
        # heads of one row, before wo.
        branch = normalize(xp, branch, cfg.sub_norm, w.get("sub_norm"), None, be.acc_dtype)
'''
SPEC_MUTANTS = [
    Mutant("one-gate-per-layer", "output_gate", "impl.attention",
           "    if cfg.output_gate:\n        # spec `output_gate`",
           "    if cfg.output_gate and gate is None:\n        # spec `output_gate`",
           {}, "attn_branch", doc="a layer with both gates applies only the interleaved one (the gates as one enum)"),
    Mutant("output-gate-after-sub-norm", "output_gate", "impl.attention",
           _OUTPUT_GATE + _SUB_NORM, _SUB_NORM + _OUTPUT_GATE,
           {}, "attn_branch", doc="the output gate multiplies the sub-normed branch instead of the heads before it"),
]
