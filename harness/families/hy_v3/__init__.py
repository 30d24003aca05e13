"""hy_v3: per-head RMS QK norm before neox RoPE (HF ``HYV3Attention`` is
``ApertusAttention``), GQA, dense leading layers, then sigmoid-routed experts with
a selection bias, a routed scale and a shared expert (HF ``HYV3ForCausalLM``,
transformers/models/hy_v3/modeling_hy_v3.py; llama.cpp arch ``hy_v3``,
src/models/hy-v3.cpp; converter conversion/hunyuan.py ``HYV3Model``).

HF ``HYV3TopKRouter.forward``: ``sigmoid(x W^T)`` in float32, top-k on ``sigmoid +
e_score_correction_bias``, the chosen sigmoids divided by their sum (``+ 1e-20``)
and scaled by ``router_scaling_factor``; ``HYV3MoE`` adds the shared expert
(``moe_intermediate_size * num_shared_experts`` wide). ``HYV3DecoderLayer``: a
dense ``HYV3MLP`` where ``mlp_layer_types[i] == "dense"`` (default: the first).

llama.cpp (hy-v3.cpp): RMS ``attn_norm``, ``build_qkv``, ``attn_q_norm`` /
``attn_k_norm`` (``{n_embd_head_k}``), NEOX RoPE (llama-model.cpp
``llama_model_rope_type``), ``build_attn`` (cb ``attn_out``); a layer without
``ffn_gate_inp`` is dense, the others ``build_moe_ffn`` with the file's
``expert_weights_norm`` / ``expert_weights_scale`` / gating (sigmoid by default)
plus the shared expert. The converter (``HYV3Model.set_gguf_parameters``):
TextModel's keys, ``expert_feed_forward_length``,
``expert_shared_feed_forward_length = moe_intermediate_size * num_shared_experts``,
``expert_weights_norm = route_norm`` (no HF field: True, HF's rule),
``expert_weights_scale = router_scaling_factor``, sigmoid gating;
``modify_tensors`` stacks the experts. The installed gguf 0.19 has no ``hy_v3``
arch: its tensors are named with dots1's map (llama.cpp's gguf-py MODEL_TENSORS
[HY_V3] less the MTP head is dots1's list).

Tiny config: 2 layers (dense, sparse), 4 heads / 2 KV heads of 16, 4 experts of 32
(2 used), one shared, HF's scale 2.826, a seeded selection bias.
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import LlamaLike, gguf_moe_convert, text_model_gguf_params
from ..glm4_moe import SeededExpertBias
from harness.lazy import lazy

gguf = lazy("gguf")

SIGMOID = 2  # llama.cpp LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (gguf ExpertGatingFuncType.SIGMOID)


class HYV3(SeededExpertBias, LlamaLike):
    name = "hy_v3"
    hf_model_type = "hy_v3"
    description = "per-head QK norm, GQA, sigmoid experts with selection bias, routed scale and a shared expert"
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, router_scaling_factor=2.826,
        mlp_layer_types=["dense", "sparse"],
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "hy_v3"
    gguf_tensor_names_from = "dots1"  # gguf 0.19 has no hy_v3 (module docstring)
    # HYV3Experts (Qwen3MoeExperts).forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    # HYV3Attention (ApertusAttention): q_norm / k_norm over the head, before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    # hy-v3.cpp names the projections (build_qkv: Qcur / Kcur) and the attention's output
    # (attn_out), but neither the QK norms' outputs nor the ggml_rope_ext results: the
    # rotated Q / K are unnamed graph nodes; kq_soft_max (attn_probs) is the first tensor
    # downstream of them, so impl's rotation is still checked against llama.cpp there
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k not in ("q_rope", "k_rope")}
    lc_not_exposed = {p: "hy-v3.cpp gives the rotated Q / K no name (no cb after ggml_rope_ext); attn_probs "
                         "(kq_soft_max) is the first named tensor past them" for p in ("q_rope", "k_rope")}

    def gguf_params(self, w, config, variant=None):
        # conversion/hunyuan.py HYV3Model.set_gguf_parameters: TextModel's keys, the experts'
        # and the shared expert's widths, the top-k weights' norm and scale, sigmoid gating

        text_model_gguf_params(w, config)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(config.moe_intermediate_size * config.num_shared_experts)
        w.add_expert_weights_norm(True)  # hparams.get("route_norm", True): no HYV3Config field
        w.add_expert_weights_scale(float(config.router_scaling_factor))
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

    def gguf_convert(self, name, data, config, variant=None):
        # HYV3Model.modify_tensors stacks the per-expert tensors (transformers 5: fused, gate
        # rows first). The selection bias: save_pretrained writes HF's e_score_correction_bias
        # back as the checkpoint's ``mlp.expert_bias`` (transformers/conversion_mapping.py
        # mapping["hy_v3"], reverted by core_model_loading.revert_weight_conversion), a name
        # with no .bias suffix, which the converter's map turns into ``blk.N.exp_probs_b`` --
        # the name hy-v3.cpp:68 loads (tn(LLM_TENSOR_FFN_EXP_PROBS_B, i): no suffix; every
        # other arch loads exp_probs_b.bias). The other renamings (router.gate, shared_mlp)
        # reach the same GGUF names either way.
        if name.endswith(".mlp.e_score_correction_bias"):
            yield name.replace(".mlp.e_score_correction_bias", ".mlp.expert_bias"), data
            return
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """hy-v3.cpp load_arch_hparams: the RMS eps, the experts' and shared widths, the
        gating (absent: sigmoid, HF's only one), the weights' scale and norm (HF always
        renormalises); a layer is dense where the file has no ffn_gate_inp."""
        hp = read_hparams(meta)
        gating = int(meta.get("expert_gating_func", 0) or SIGMOID)
        if gating != SIGMOID:
            meta.refuse("expert_gating_func", gating, f"HF HYV3TopKRouter routes by sigmoid ({SIGMOID})")
        if not bool(meta.get("expert_weights_norm", False)):
            meta.refuse("expert_weights_norm", False, "HF HYV3TopKRouter always divides the top-k by their sum")
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        moe_ff = one_per_layer(meta, "expert_feed_forward_length", hp.n_layer)
        shexp = int(meta.get("expert_shared_feed_forward_length", moe_ff))
        if shexp % moe_ff:
            meta.refuse("expert_shared_feed_forward_length", shexp,
                        f"not a multiple of expert_feed_forward_length {moe_ff} (HF: moe_intermediate_size x "
                        "num_shared_experts)")
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, moe_intermediate_size=moe_ff, num_shared_experts=shexp // moe_ff,
                  router_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                  mlp_layer_types=["sparse" if f"blk.{i}.ffn_gate_inp.weight" in shapes else "dense"
                                   for i in range(hp.n_layer)])
        return kw


FAMILY = HYV3()
