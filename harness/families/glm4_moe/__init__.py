"""glm4_moe: GLM-4.5 -- neox partial RoPE (0.5), q/k/v biases, an optional
per-head QK norm, and a sigmoid-routed MoE with a shared expert after
``first_k_dense_replace`` dense layers (HF ``Glm4MoeForCausalLM``,
transformers/models/glm4_moe/modeling_glm4_moe.py; llama.cpp arch ``glm4moe``,
src/models/glm4-moe.cpp; converter conversion/glm.py ``Glm4MoeModel``).

HF:
- ``Glm4MoeAttention``: q/k/v biases (``attention_bias``), no o_proj bias;
  ``if self.use_qk_norm``: ``q_norm`` / ``k_norm`` (RMS over ``head_dim``)
  BEFORE RoPE; ``apply_rotary_pos_emb`` rotates the first ``head_dim *
  partial_rotary_factor`` channels with ``rotate_half`` (neox pairs), the rest
  pass; ``Glm4MoeConfig`` defaults the factor to 0.5;
- ``Glm4MoeDecoderLayer``: llama's residual shape; layers ``>=
  first_k_dense_replace`` take ``Glm4MoeMoE``, the others ``Glm4MoeMLP``;
- ``Glm4MoeTopkRouter.forward``: ``sigmoid`` scores, the choice on ``scores +
  e_score_correction_bias`` (grouped by ``n_group`` / ``topk_group``), the
  weights the chosen UNBIASED scores, renormalised ``if norm_topk_prob`` (``+
  1e-20``), times ``routed_scaling_factor``; plus ``shared_experts(x)``.

llama.cpp (glm4-moe.cpp): ``build_qkv`` (biases), ``attn_q_norm`` /
``attn_k_norm`` when present (TENSOR_NOT_REQUIRED: the QK norm is the file's
switch), ``ggml_rope_ext`` of ``n_rot`` with LLAMA_ROPE_TYPE_NEOX
(llama-model.cpp llama_model_rope_type: GLM4_MOE without M-RoPE), scale
``1/sqrt(head_dim)``; ``attn_post_norm`` is HF's ``post_attention_layernorm``
(the pre-FFN norm, cb ``post_attn_norm``); layers ``< n_layer_dense_lead`` dense,
the others ``build_moe_ffn(..., exp_probs_b, ..., expert_weights_norm,
expert_weights_scale, gating_func)`` plus the shared expert -- the same routing.
The converter (``Glm4MoeModel.set_gguf_parameters``) writes TextModel's keys,
``rope.dimension_count = head_dim * partial_rotary_factor (default 0.5)``, the
expert counts and width, shared count, leading dense count, SIGMOID gating, the
weights' scale and norm; no Q/K permutation (neox already). The MTP layers: HF
builds none (``num_nextn_predict_layers`` is config only), and the export is
the converter's ``--no-mtp`` (the harness compares no MTP head:
``_gguf_import.read_hparams`` refuses ``nextn_predict_layers``).

Tiny config: head_dim 16 (8 rotated), QK norm on (GLM-4.5-Air's
``use_qk_norm: true``), layer 0 dense and layer 1 MoE (4 experts of 32, 2 used,
1 shared), ``routed_scaling_factor`` 2.5, a seeded nonzero
``e_score_correction_bias`` (HF initialises it to zeros: the choice's bias would
otherwise go unchecked).
"""

from __future__ import annotations

import dataclasses

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import LlamaLike, gguf_moe_convert, text_model_gguf_params
from harness.lazy import lazy

torch = lazy("torch")
gguf = lazy("gguf")

QK_NORM = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")  # Glm4MoeAttention q_norm / k_norm


class SeededExpertBias:
    """HF's ``e_score_correction_bias`` is a buffer its init zeroes (``*TopkRouter``:
    ``init.zeros_``; Family.init_weights seeds parameters only): seeded here so the
    expert choice (on ``sigmoid + bias``) depends on it, as a trained checkpoint's
    does, and a reference that drops it shows. Mixed in before the family's base."""

    # sigmoid scores lie in (0, 1): a bias of this std changes some tokens' choice
    _expert_bias_std = 0.3

    def init_weights(self, model, seed: int) -> None:
        super().init_weights(model, seed)
        gen = torch.Generator().manual_seed(7919 + seed)
        with torch.no_grad():
            for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
                if name.endswith("e_score_correction_bias"):
                    b.copy_(self._expert_bias_std * torch.randn(b.shape, generator=gen, dtype=torch.float64))


class Glm4Moe(SeededExpertBias, LlamaLike):
    name = "glm4_moe"
    hf_model_type = "glm4_moe"
    description = "neox partial RoPE (0.5), QKV bias, optional QK norm, sigmoid experts + shared after dense layers"
    fuzz_space = {"knobs": ("heads", "theta", "partial")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, attention_bias=True, use_qk_norm=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "glm4moe"
    # Glm4MoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def layer_config(self, config, i):
        lc = super().layer_config(config, i)
        if getattr(config, "use_qk_norm", False):  # Glm4MoeAttention: if self.use_qk_norm
            lc = lc.replace(qk_norm=dataclasses.replace(QK_NORM, norm=NormSpec("rms", self.norm_eps(config))))
        return lc

    def gguf_params(self, w, config, variant=None):
        # conversion/glm.py Glm4MoeModel.set_gguf_parameters (with --no-mtp): TextModel's keys,
        # rope.dimension_count = head_dim * partial_rotary_factor (default 0.5), then the MoE keys

        text_model_gguf_params(w, config)
        prf = (config.rope_parameters or {}).get("partial_rotary_factor", 0.5)
        w.add_rope_dimension_count(int(self.head_dim(config) * prf))
        w.add_expert_count(config.n_routed_experts)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_count(config.n_shared_experts)
        w.add_leading_dense_block_count(config.first_k_dense_replace)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(config.routed_scaling_factor)
        w.add_expert_weights_norm(config.norm_topk_prob)

    def gguf_convert(self, name, data, config, variant=None):
        # Glm4MoeModel.modify_tensors stacks the per-expert tensors (transformers 5 holds them
        # fused, gate rows first); ModelBase maps e_score_correction_bias to exp_probs_b; the
        # rest by gguf's tensor map (post_attention_layernorm -> post_attention_norm), unpermuted
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def lc_refusal(self, config) -> str | None:
        if int(getattr(config, "n_group", 1) or 1) > 1:
            # glm4-moe.cpp load_arch_hparams reads no expert_group_count: grouped top-k has no key
            return (f"n_group {config.n_group}: llama.cpp's glm4moe graph routes without expert groups "
                    "(load_arch_hparams reads no expert_group_count); run it against --ref hf")
        return super().lc_refusal(config)

    def config_from_gguf(self, meta, shapes, tensors):
        """glm4-moe.cpp load_arch_hparams: the experts' width, the RMS eps, the shared
        count (required), the leading dense layers, the weights' scale and norm, the
        gating function (default sigmoid: HF's only one), the M-RoPE sections
        (GLM-4.5V; refused). The QK norm is the file's attn_q_norm (optional tensor),
        the rotated width rope.dimension_count."""
        hp = read_hparams(meta)
        if meta.get("rope.dimension_sections", None):
            meta.refuse("rope.dimension_sections", meta.get("rope.dimension_sections"),
                        "M-RoPE (GLM-4.5V); HF Glm4Moe's text model rotates one position")
        gating = int(meta.get("expert_gating_func", 2) or 2)  # NONE (0) -> sigmoid, as the loader
        if gating != 2:
            meta.refuse("expert_gating_func", gating, "HF Glm4MoeTopkRouter routes by sigmoid (2)")
        kw = llama_like_config(self, meta, shapes, hp, moe=True, rotary=False)
        n_exp, n_used = experts(meta, hp, self.name)
        kw["rope_parameters"]["partial_rotary_factor"] = hp.n_rot / hp.n_embd_head_k
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), n_routed_experts=n_exp,
                  num_experts_per_tok=n_used, n_group=1, topk_group=1,
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  n_shared_experts=int(meta.get("expert_shared_count")),
                  first_k_dense_replace=int(meta.get("leading_dense_block_count", 0)),
                  routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                  norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                  use_qk_norm="blk.0.attn_q_norm.weight" in shapes,
                  attention_bias="blk.0.attn_q.bias" in shapes or "blk.0.attn_qkv.bias" in shapes)
        return kw


FAMILY = Glm4Moe()
