"""Mutants of issue 5's decorations (features II): the interleaved Q gate
(qwen3_next, qwen3_5_text), the attention sub-norm (bitnet), the value scale
(mimo_v2_flash) -- each broken in impl's one body and caught, in the family
that brings the decoration, at the probe where the break first acts."""

from ...mutant import Mutant

QWEN3_NEXT = {"family": "qwen3_next"}
# HF-only: q_proj's bias is as wide as q_proj, per head [q | gate] (llama.cpp's qwen3next has no bias slots)
QWEN3_NEXT_BIAS = {"family": "qwen3_next", "overrides": (("attention_bias", True),)}
QWEN3_5 = {"family": "qwen3_5_text"}
BITNET = {"family": "bitnet"}
MIMO = {"family": "mimo_v2_flash"}
GATE_NOTE = ("the gate is half of q_proj's output in HF (Qwen3NextAttention: torch.chunk of the q_proj view, then "
             "* sigmoid(gate)); no config, weight or module switch removes it: listed as unswitchable")

# impl.attention: from the interleaved gate's product to wo (the gate moves past wo)
_GATE_TO_WO = '''        branch = branch * _sigmoid(xp, gate)
    if cfg.output_gate:
        # spec `output_gate`: a projection of the SAME normed input the QKV read.
        branch = branch * _output_gate(layer, normed, n)
    if cfg.sub_norm is not None:
        # bitnet.cpp / HF BitNetAttention `attn_sub_norm`: RMS over the concatenated
        # heads of one row, before wo.
        branch = normalize(xp, branch, cfg.sub_norm, w.get("sub_norm"), None, be.acc_dtype)
    put("attn_branch", branch)

    out = _linear(xp, branch, w["wo"], None)
'''

# impl.attention: from what enters wo to the value scale (the scale moves before wo)
_BRANCH_TO_VALUE_SCALE = '''    put("attn_branch", branch)

    out = _linear(xp, branch, w["wo"], None)
    # spec project_attn_rows: the wo scale companion, THEN the bias (build_attn's
    # order), then the value scale (mimo2.cpp), then the post-attention norm.
    if cfg.o_scale is not None:
        out = out * cfg.o_scale
    if "bo" in w:
        out = out + w["bo"]
    if cfg.value_scale is not None:
        out = out * cfg.value_scale
'''

MUTANTS = [
    # --- the interleaved Q gate (qwen3_next, qwen3_5_text) ---
    Mutant("q-gate-not-interleaved", "q_gate_interleaved", "impl.attention",
           "q, gate = qg[..., :d], xp.reshape(qg[..., d:], (n, h * d))",
           "q, gate = q[:, : h * d], q[:, h * d :]",
           QWEN3_NEXT, "q",
           doc="the double-width q_proj read as [all queries | all gates] instead of [q, gate] per head "
               "(HF: q_proj(x).view(..., head_dim * 2).chunk(2))",
           bisect_note=GATE_NOTE),
    Mutant("q-gate-tanh-for-sigmoid", "q_gate_interleaved", "impl.attention",
           "branch = branch * _sigmoid(xp, gate)", "branch = branch * xp.tanh(gate)",
           QWEN3_5, "attn_branch", doc="the gate squashed by tanh instead of the sigmoid",
           bisect_note=GATE_NOTE),
    Mutant("q-gate-after-wo", "q_gate_interleaved", "impl.attention",
           _GATE_TO_WO,
           _GATE_TO_WO.replace("        branch = branch * _sigmoid(xp, gate)\n", "        pass\n")
           + "    out = out * _sigmoid(xp, gate)  # the gate applied to wo's output\n",
           QWEN3_NEXT, "attn_branch",
           doc="the sigmoid gate multiplies wo's output instead of the attention output entering wo "
               "(hidden_size == n_heads * head_dim in the tiny config, so the shapes still fit)",
           bisect_note=GATE_NOTE),
    # --- the Q bias and the gate's own bias, after the split (qwen3_next + attention_bias) ---
    Mutant("gate-bias-dropped", "qkv_bias", "impl.attention",
           'gate = gate + w["bq_gate"]', "gate = gate",
           QWEN3_NEXT_BIAS, "attn_branch",
           doc="the gate halves of HF's double-width q_proj bias are never added: Q is right, the gate is not"),
    Mutant("q-bias-biases-the-gate", "qkv_bias", "impl.attention",
           'gate = gate + w["bq_gate"]', 'gate = gate + w["bq"]',
           QWEN3_NEXT_BIAS, "attn_branch",
           doc="the Q bias (Q width) is added to the gate in place of the gate's own bias -- the mix-up a bias "
               "applied before the split, at the wrong width, makes"),
    # --- the sub-norm (bitnet) ---
    Mutant("sub-norm-per-head", "sub_norm", "impl.attention",
           'branch = normalize(xp, branch, cfg.sub_norm, w.get("sub_norm"), None, be.acc_dtype)',
           'branch = xp.reshape(normalize(xp, xp.reshape(branch, (n, h, dv)), cfg.sub_norm, None, None, '
           'be.acc_dtype), (n, h * dv)) * w["sub_norm"]',
           BITNET, "attn_branch",
           doc="the RMS of the sub-norm taken over each head instead of the concatenated heads of the row"),
    Mutant("sub-norm-weight-dropped", "sub_norm", "impl.attention",
           'branch = normalize(xp, branch, cfg.sub_norm, w.get("sub_norm"), None, be.acc_dtype)',
           "branch = normalize(xp, branch, cfg.sub_norm, None, None, be.acc_dtype)",
           BITNET, "attn_branch", doc="the sub-norm forgets its weight"),
    # --- the value scale (mimo_v2_flash) ---
    Mutant("value-scale-before-wo", "value_scale", "impl.attention",
           _BRANCH_TO_VALUE_SCALE,
           "    if cfg.value_scale is not None:\n        branch = branch * cfg.value_scale\n"
           + _BRANCH_TO_VALUE_SCALE.replace("        out = out * cfg.value_scale\n", "        pass\n"),
           MIMO, "attn_branch",
           doc="the value scale applied to what enters wo instead of wo's output (HF's placement, on V): the "
               "branch it adds to the residual is the same here (o_proj has no bias), the tensor entering wo "
               "is not"),
    Mutant("value-scale-dropped", "value_scale", "impl.attention",
           "        out = out * cfg.value_scale\n", "        out = out\n",
           MIMO, "attn_out", doc="the value scale is never applied"),
]
