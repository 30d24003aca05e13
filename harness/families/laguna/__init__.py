"""laguna (poolside): a SOFTPLUS output gate -- one scalar per head (XS.2's
``gating = True`` / ``"per-head"``) or one per channel (M.1's
``"per-element"``) --, per-head QK norms before RoPE, per-layer-type RoPE
(its own theta and rotary width on full and sliding layers), per-layer head
counts and a sigmoid-routed MoE with a score-correction bias and one shared
expert (HF ``LagunaForCausalLM``; llama.cpp ``src/models/laguna.cpp``;
converter ``conversion/laguna.py``).

HF (``modeling_laguna.py``):
- ``LagunaAttention.__init__``: ``gate_per_head = config.gating is True or
  config.gating == "per-head"``; ``g_proj = nn.Linear(hidden, num_heads if
  gate_per_head else num_heads * head_dim, bias=False)``; ``num_heads`` is
  ``num_attention_heads_per_layer[layer_idx]``; ``q_norm`` / ``k_norm`` are
  ``LagunaRMSNorm(head_dim)``.
- ``LagunaAttention.forward``: q/k/v/g_proj read the SAME normed input; q_norm /
  k_norm per head, then ``apply_rotary_pos_emb`` (rotate-half over the leading
  ``rotary_dim`` channels, the rest passed through); after the attention
  ``gate = F.softplus(g_proj(hidden_states).float())`` multiplies the heads --
  per head ``view(..., -1, head_dim) * gate.unsqueeze(-1)`` -- BEFORE o_proj
  (impl ``LayerConfig.output_gate`` with ``output_gate_fn = "softplus"`` and
  ``output_gate_per_head``; weight ``wg``).
- ``LagunaRotaryEmbedding``: one table per layer type from
  ``rope_parameters[layer_type]`` (``rope_theta``, ``partial_rotary_factor``);
  ``LagunaModel.forward`` hands each layer its type's table and mask
  (sliding layers: ``create_sliding_window_causal_mask``).
- ``LagunaDecoderLayer``: pre-norm, no post-attention norm; ``mlp_layer_types``
  dense / sparse (``LagunaSparseMoeBlock``: sigmoid scores, the
  ``e_score_correction_bias`` for the choice only, renormalised top-k,
  ``moe_routed_scaling_factor``, a shared expert added).

llama.cpp (``laguna.cpp``): ``attn_gate_proj = build_lora_mm(wqkv_gate,
attn_inp)`` on the ``attn_norm`` output; ``Qcur_normed`` / ``Kcur_normed``;
``ggml_rope_ext`` with ``n_rot_swa`` / ``rope_freq_base_train_swa`` on the
sliding layers and ``n_rot`` / ``freq_base`` on the full ones (``Qcur_rope``);
``build_attn`` WITHOUT ``wo`` (renamed ``attn_out``: the heads);
``ggml_softplus`` (``attn_gate_softplus``), reshaped to ``[1, n_head, T]`` when
the gate tensor is ``n_head`` wide (per head) or multiplied directly
(``attn_gated``: the branch); ``attn_o_proj``; no post norm (``ffn_inp``). The
window pattern is ``load_swa_pattern(ml, 4, dense_first=true)``: layer ``il``
is full exactly when ``il % 4 == 0`` (the converter writes no pattern key).
NEOX RoPE (llama-model.cpp ``llama_model_rope_type``); the converter
(``conversion/laguna.py`` ``LagunaModel(TextModel)``) does not permute Q/K,
writes the per-layer head counts as an array, ``rope.dimension_count`` from
the full layers' and ``rope.dimension_count_swa`` from the sliding layers'
``partial_rotary_factor``, and stacks the per-expert weights.

The installed gguf-py (0.19) has no LAGUNA arch: the tensor names come from
step35's map, whose tensor list is the vendored gguf-py's
``MODEL_TENSORS[LAGUNA]`` plus ``rope_freqs`` (blk.N.attn_gate and ffn_norm
included, no post norms).

Configs:
- default (below): 4 layers, full / sliding / sliding / sliding (the pattern
  llama.cpp fixes: full at ``il % 4 == 0``), window 4, full layers theta 500000
  rotating half the head (16 of 32 channels), sliding layers theta 10000
  rotating all of it, 4 query heads on the full layers and 8 on the sliding
  ones (2 KV heads: the per-layer head counts XS.2 has), the per-head softplus
  gate, layer 0 dense and 1-3 MoE (4 experts, 2 used, routed scale 1.5).
- ``--set gating=per-element``: M.1's gate, one value per channel.
- other ``layer_types`` (or a window with no sliding layer where llama.cpp
  would slide): HF-only, refused for llama.cpp in one line
  (``reference_refusal``); llama.cpp would run its own pattern.
"""

from __future__ import annotations

import dataclasses

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams, swa_pattern
from ..base import LlamaLike, LcPoint, gguf_moe_convert, text_model_gguf_params
from harness.lazy import lazy

gguf = lazy("gguf")

_S, _F = "sliding_attention", "full_attention"


class Laguna(LlamaLike):
    name = "laguna"
    # the layer count with what llama.cpp's laguna fixes along with it (the generic knob,
    # fuzz.layer_count_overrides, cycles every per-layer list and would put a dense layer
    # after the sparse ones, which lc_refusal refuses): full at il % 4 == 0, dense leading
    fuzz_space = {"knobs": ("head_dim", "window", "values"), "values": {
        ("num_hidden_layers", "num_attention_heads_per_layer", "layer_types", "mlp_layer_types"): (
            (4, [4, 8, 8, 8], [_F, _S, _S, _S], ["dense", "sparse", "sparse", "sparse"]),
            (5, [4, 8, 8, 8, 4], [_F, _S, _S, _S, _F], ["dense", "sparse", "sparse", "sparse", "sparse"]))}}
    hf_model_type = "laguna"
    description = ("softplus output gate (one scalar per head or per channel), QK norm, per-layer-type RoPE "
                   "and rotary width, per-layer head counts, MoE")
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_attention_heads_per_layer=[4, 8, 8, 8], num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=4,
        layer_types=[_F, _S, _S, _S], mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        rope_parameters={_F: {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                         _S: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}},
        num_experts=4, num_experts_per_tok=2, moe_routed_scaling_factor=1.5, gating=True,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "laguna"
    extra_settable = ("gating", "num_attention_heads_per_layer")
    # LagunaExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    lc_points = {
        **LlamaLike.lc_points,
        # build_qkv's last Qcur/Kcur is the [D, H, T] reshape; the ROPE output is renamed
        "q": LcPoint("Qcur", "last", "heads"),
        "k": LcPoint("Kcur", "last", "heads"),
        "q_rope": LcPoint("Qcur_rope", "last", "heads"),
        "k_rope": LcPoint("Kcur_rope", "last", "heads"),
        # build_attn is called without wo; laguna.cpp renames its result "attn_out": the heads
        "attn_heads": LcPoint("attn_out"),
        "attn_branch": LcPoint("attn_gated"),
        "attn_out": LcPoint("attn_o_proj"),
    }

    # ------------------------------------------------------------------ impl
    # LagunaAttention: q_norm / k_norm = LagunaRMSNorm(head_dim), before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    # LagunaModel.forward: position_embeddings[config.layer_types[i]]
    rope_per_layer_type = True
    weight_map = {**LlamaLike.weight_map, "self_attn.g_proj.weight": "wg"}

    @staticmethod
    def _per_head_gate(config) -> bool:
        # LagunaAttention.__init__: gate_per_head = config.gating is True or config.gating == "per-head"
        return config.gating is True or config.gating == "per-head"

    def layer_config(self, config, i: int):
        # LagunaAttention.forward: attn_output * softplus(g_proj(hidden_states)), before o_proj;
        # num_heads = num_attention_heads_per_layer[layer_idx]
        return super().layer_config(config, i).replace(
            n_heads=config.num_attention_heads_per_layer[i], output_gate=True, output_gate_fn="softplus",
            output_gate_per_head=self._per_head_gate(config))

    def lc_refusal(self, config) -> str | None:
        # laguna.cpp load_swa_pattern(ml, 4, dense_first=true) and no pattern key from the converter
        want = [il % 4 == 0 for il in range(config.num_hidden_layers)]
        got = [t == _F for t in config.layer_types]
        if config.sliding_window and got != want:
            return (f"layer_types {['full' if g else 'sliding' for g in got]}: llama.cpp's laguna fixes the "
                    "window pattern (laguna.cpp load_swa_pattern(ml, 4, dense_first): full at il % 4 == 0; "
                    "the converter writes no pattern key); use that pattern or run it against --ref hf")
        # conversion/laguna.py LagunaModel.set_gguf_parameters counts the LEADING dense layers
        # (add_leading_dense_block_count) and laguna.cpp load_arch_tensors gives every layer
        # il >= n_layer_dense_lead a router (ffn_gate_inp): a dense layer after a sparse one
        # has none in the file, and the load fails (check_tensor_dims: tensor
        # 'blk.N.ffn_gate_inp.weight' not found)
        mlp = list(config.mlp_layer_types)
        lead = next((i for i, t in enumerate(mlp) if t != "dense"), len(mlp))
        if "dense" in mlp[lead:]:
            return (f"mlp_layer_types {mlp}: llama.cpp's laguna holds leading dense layers only (the converter "
                    "writes leading_dense_block_count; laguna.cpp gives every later layer a router); valid: "
                    "'dense' layers first, then 'sparse', or run it against --ref hf")
        return None

    # ------------------------------------------------------------------ GGUF
    def gguf_tensor_map(self, config):
        # gguf-py 0.19 has no MODEL_ARCH.LAGUNA. step35's tensor list is the vendored
        # gguf-py's MODEL_TENSORS[LAGUNA] plus rope_freqs (which a laguna model never has):
        # the same names, post_attention_layernorm -> ffn_norm and g_proj -> attn_gate

        return gguf.get_tensor_name_map(gguf.MODEL_ARCH.STEP35, config.num_hidden_layers)

    def gguf_params(self, w, config, variant=None):
        # conversion/laguna.py LagunaModel.set_gguf_parameters: TextModel's keys, then
        # laguna's own, in its order
        text_model_gguf_params(w, config)
        w.add_vocab_size(config.vocab_size)
        w.add_head_count(list(config.num_attention_heads_per_layer))
        if config.sliding_window:
            w.add_sliding_window(config.sliding_window)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
        w.add_expert_weights_norm(True)  # HF reference always sum-normalises after top-k
        w.add_expert_weights_scale(float(config.moe_routed_scaling_factor))

        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        lead = 0
        for t in config.mlp_layer_types:
            if t != "dense":
                break
            lead += 1
        w.add_leading_dense_block_count(lead)
        rp = config.rope_parameters
        w.add_rope_dimension_count(int(config.head_dim * float(rp[_F].get("partial_rotary_factor", 1.0))))
        if rp.get(_S) is not None:
            w.add_rope_dimension_count_swa(int(config.head_dim * float(rp[_S].get("partial_rotary_factor", 1.0))))

    def gguf_convert(self, name, data, config, variant=None):
        # LagunaModel.modify_tensors: the per-expert weights stacked (transformers 5 keeps
        # them fused: gguf_moe_convert splits gate_up), the router bias through the plain map
        yield from gguf_moe_convert(name, data) or [(name, data)]

    def config_from_gguf(self, meta, shapes, tensors):
        """laguna.cpp load_arch_hparams: the RMS eps, the leading dense layers, the
        experts' widths (routed and shared), gating (default sigmoid), the routed
        scale and norm; with a window > 0 ``load_swa_pattern(ml, 4, dense_first)``,
        ``rope.freq_base_swa`` (default: the full layers') and
        ``rope.dimension_count_swa``. The gate's width (n_head or n_head * head_dim)
        says per head or per channel, as load_arch_tensors reads it."""
        hp = read_hparams(meta)
        n_swa = int(meta.get("attention.sliding_window", 0))
        heads = list(hp.n_head)  # the per-layer array conversion/laguna.py writes
        # llama_like_config reads one head count (HF's num_attention_heads); laguna's per-layer
        # ones are HF's num_attention_heads_per_layer, set below
        kw = llama_like_config(self, meta, shapes, dataclasses.replace(hp, n_head=[heads[0]] * hp.n_layer),
                               swa=n_swa > 0, moe=True, rotary=False)
        head_dim = kw["head_dim"]
        theta = hp.rope_freq_base
        n_rot = hp.n_rot
        full = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": n_rot / head_dim}
        if n_swa > 0:
            swa = swa_pattern(meta, hp, 4, dense_first=True)
            theta_swa = meta.get_f32("rope.freq_base_swa", theta)
            n_rot_swa = hp.n_rot_swa
            rope = {_F: full, _S: {"rope_type": "default", "rope_theta": theta_swa,
                                   "partial_rotary_factor": n_rot_swa / head_dim}}
        else:
            swa = [False] * hp.n_layer
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa", "rope.dimension_count_swa"):
                meta.skip(key, "laguna.cpp reads it only when attention.sliding_window > 0")
            rope = {_F: full}
        n_exp, n_used = experts(meta, hp, self.name)
        if int(meta.get("expert_gating_func", 2)) != 2:
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF Laguna routes by sigmoid (2)")
        if not meta.get("expert_weights_norm", False):
            meta.refuse("expert_weights_norm", meta.get("expert_weights_norm", False),
                        "unnormalised top-k weights; HF LagunaTopKRouter always renormalises them")
        if int(meta.get("expert_shared_count", 1)) != 1:
            meta.refuse("expert_shared_count", meta.get("expert_shared_count"), "HF Laguna has one shared expert")
        n_lead = int(meta.get("leading_dense_block_count"))
        gate = shapes.get("blk.0.attn_gate.weight")
        per_head = gate is None or gate[0] == heads[0]
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  num_attention_heads=heads[0], num_attention_heads_per_layer=list(heads),
                  num_experts=n_exp, num_experts_per_tok=n_used,
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  shared_expert_intermediate_size=int(meta.get("expert_shared_feed_forward_length")),
                  moe_routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                  mlp_layer_types=["dense" if i < n_lead else "sparse" for i in range(hp.n_layer)],
                  gating=True if per_head else "per-element", sliding_window=n_swa or None,
                  rope_parameters=rope, layer_types=[_S if s else _F for s in swa])
        return kw


FAMILY = Laguna()
