"""The recurrent kinds: ``contract.recurrent.RecurrentConfig`` layers, the layers
hybrid models put in attention's place (the spec's ``AttnShape::{ShortConv,
Mamba2, Mamba1, Gdn, Lightning}`` and Kimi's delta attention). ONE plug-in,
registered under every recurrent kind name (pyproject.toml
``[project.entry-points."attn_conformance.kinds"]``): a description's ``kind``
is ``gated_delta_net``, ``kimi_delta``, ``short_conv``, ... and each finds this
plug-in, as each finds impl's one recurrent body (``impl.runner.load_layer``).

impl's body is ``impl.recurrent.recurrent_block``; the spec's own formula of
the recurrence, written plainly in float64 and independently of impl,
``harness/kinds/recurrent/spec.py``; the mutants ``harness/kinds/recurrent/mutants.py``.

A recurrent layer has no KV rows: what a sequence carries from call to call is
its state (the conv rows and the recurrent matrix, ``impl.kv.recurrent_slot``),
whose size does not grow with the tokens. ``dims`` therefore reads no KV
heads and no scores (no ``attn_probs``), and ``probe_elems`` counts the
recurrent probes and the per-call state snapshots a comparison holds
(harness/budget.py).
"""

from __future__ import annotations

from contract.recurrent import RECURRENT_KINDS, RecurrentConfig

from .. import LayerKind
from .spec import recurrent_layer

# tag -> (what it is, where the spec / the references name it)
DECORATIONS = {
    "gated_delta_net": ("gated delta-net: the delta rule with a per-head log-decay",
                        "attn_block: AttnShape::Gdn (HF Qwen3NextGatedDeltaNet, llama.cpp delta-net-base.cpp)"),
    "kimi_delta": ("Kimi delta attention: the delta rule with a per-key-channel log-decay",
                   "(Kimi's delta attention; HF KimiLinearDeltaAttention, llama.cpp kimi-linear.cpp)"),
    "short_conv": ("short conv: C * conv(B * x), no recurrence (the conv rows are the state)",
                   "attn_block: AttnShape::ShortConv (HF Lfm2ShortConv, llama.cpp lfm2.cpp)"),
    "mamba2": ("Mamba-2 selective state space (SSD)", "attn_block: AttnShape::Mamba2"),
    "mamba1": ("Mamba-1 selective scan", "attn_block: AttnShape::Mamba1"),
    "lightning": ("lightning attention: a constant per-head decay", "attn_block: AttnShape::Lightning"),
    "causal_conv": ("the depthwise causal conv over the sequence's conv state ++ the call's rows",
                    "recurrent_slot: the conv rows (HF causal_conv1d_fn / _update, ggml_ssm_conv)"),
    "conv_bias": ("a bias on the causal conv", "(HF conv1d.bias)"),
    "in_proj_bias": ("biases on the in-projections", "(HF conv_bias / use_bias)"),
    "out_proj_bias": ("a bias on out_proj", "(HF out_proj.bias)"),
    "qk_l2_norm": ("q and k L2-normalised before the recurrence",
                   "(HF l2norm, llama.cpp build_gdn_l2_norm)"),
    "beta_gate": ("the write strength beta = sigmoid(b)", "(HF b.sigmoid(), llama.cpp beta_sigmoid)"),
    "log_decay": ("the log-decay g = -exp(A_log) * softplus(a + dt_bias)",
                  "(HF g = -A_log.exp() * softplus(a + dt_bias), llama.cpp a_softplus * ssm_a)"),
    "grouped_v_heads": ("more value heads than key heads, value head h reading key head h // (Hv / Hk)",
                        "(HF repeat_interleave, llama.cpp qwen3next.cpp repeat interleave)"),
    "tiled_v_heads": ("more value heads than key heads, value head h reading key head h % Hk",
                      "(llama.cpp qwen35.cpp, ggml gated_delta_net)"),
    "low_rank_gates": ("the decay and output gate through rank-r bottlenecks (f_a/f_b, g_a/g_b)",
                       "(HF KimiLinearForgetGate, g_a_proj / g_b_proj)"),
    "gated_out_norm": ("the output: RMS norm per head, then times the gate's activation of z",
                       "(HF Qwen3NextRMSNormGated, KimiLinearRMSNormGated)"),
    "recurrent_state": ("the state a sequence carries between calls (conv rows, recurrent matrix)",
                        "KvStep::recurrent_slot (HF LinearAttentionLayer conv_states / recurrent_states, "
                        "llama.cpp r_l / s_l)"),
    "chunked_scan": ("the recurrence in chunks (the WY / UT form)", "(HF torch_chunk_gated_delta_rule)"),
    "dt_bc_norm": ("Mamba-1's RMS norms on dt / B / C after x_proj (weightless, or with weights)",
                   "(HF FalconMambaMixer dt_layernorm / b_layernorm / c_layernorm, JambaMambaMixer; llama.cpp "
                   "mamba-base.cpp build_mamba_layer ssm_dt_b_c_rms)"),
    "residual_multiplier": ("residual multiplier", "(family residual layout)"),
    "normed_residual": ("the branch added to the NORMED input times alpha, not to the input",
                        "(HF MiniMaxDecoderLayer residual * alpha + attn * beta, minimax-01.cpp f_residual_scale)"),
}

REFERENCE_GAPS = {
    "tiled_v_heads": "no HF family reads value heads tiled; llama.cpp's qwen35 does (its converter reorders "
                     "the weights grouped -> tiled), which the qwen3_5_text family canonicalizes back to "
                     "grouped; impl's tiled map is checked against HF on the reordered weights in "
                     "tests/test_recurrent_impl.py",
    "chunked_scan": "a form of impl's scan (RecurrentConfig.scan), not a setting of any reference: judged "
                    "against the sequential form and HF in tests/test_recurrent_impl.py",
}


class Recurrent(LayerKind):
    description = RecurrentConfig
    decorations = DECORATIONS
    reference_gaps = REFERENCE_GAPS
    rope_probe = ""  # no RoPE: no bound carries an angle error from these layers
    mutant_modules = ("harness.kinds.recurrent.mutants",)

    def features(self, rc, weights=None) -> set[str]:
        """The tags ON for one layer, from what impl is told to compute (the
        description and the names of the weights it is handed)."""
        w = weights or {}
        f = {rc.kind}
        if rc.conv_kernel:
            f.add("causal_conv")
        if rc.conv_bias or "conv_b" in w:
            f.add("conv_bias")
        if rc.in_bias:
            f.add("in_proj_bias")
        if rc.out_bias or "bo" in w:
            f.add("out_proj_bias")
        if rc.qk_norm == "l2":
            f.add("qk_l2_norm")
        if rc.beta == "sigmoid":
            f.add("beta_gate")
        if rc.decay_param == "softplus_A":
            f.add("log_decay")
        if rc.has_recurrence and rc.n_v_heads > rc.n_k_heads:
            f.add(f"{rc.head_map}_v_heads")
        if rc.decay_rank is not None or rc.z_rank is not None:
            f.add("low_rank_gates")
        if rc.gate_order == "norm_then_gate" and rc.out_norm_groups is None:
            f.add("gated_out_norm")
        f.add("recurrent_state")
        if rc.scan == "chunked":
            f.add("chunked_scan")
        if rc.bc_norm is not None:
            f.add("dt_bc_norm")
        if rc.residual == "normed" or rc.residual_alpha != 1.0:
            f.add("normed_residual")
        if rc.residual_beta != 1.0:
            # granitemoehybrid's Mamba branch times residual_multiplier (the attention kind's tag)
            f.add("residual_multiplier")
        return f

    def dims(self, rc):
        """No KV heads and no scores: ``(hidden, 0, 0, 0, 0)``; the layer's probes and
        states are ``probe_elems``."""
        return int(rc.hidden_size), 0, 0, 0, 0

    def probe_elems(self, rc, seqs: int, tokens: int) -> int:
        """Elements of one layer's recurrent probes (the conv's input and output, z,
        q / k / v, the gates, y, the branch) and of its state snapshots, one per call
        (at most one call per token: the decode schedule)."""
        hk, hv, dk, dv = rc.n_k_heads, rc.n_v_heads, rc.k_dim, rc.v_dim
        rows = 2 * rc.conv_channels + 3 * rc.width + 2 * hk * dk + hv * dv + 2 * hv * max(dk, 1)
        state = rc.conv_channels * max(rc.conv_kernel - 1, 0) + (hv * dk * dv if rc.has_recurrence else 0)
        return seqs * tokens * (rows + state)

    def spec_layer(self, desc, weights, x):
        return recurrent_layer(desc, weights, x)


KINDS = RECURRENT_KINDS  # every name this plug-in is registered under (pyproject.toml)
