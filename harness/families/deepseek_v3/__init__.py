"""deepseek_v3: multi-head latent attention (HF ``DeepseekV3ForCausalLM``,
modeling_deepseek_v3.py ``DeepseekV3Attention``; llama.cpp arch ``deepseek2``,
the same graph and converter class as deepseek_v2 -- see deepseek_v2.py for the
two variants and what they export).

What differs from deepseek_v2 on the attention side:
- the RoPE function: ``apply_rotary_pos_emb_interleave`` (``rope_interleave=
  True``, the default and every real checkpoint) rotates the interleaved pairs
  like ggml's NORM rope but RETURNS the slice de-interleaved; the capture
  re-interleaves HF's ``q_rope`` / ``k_rope`` rope slice into the canonical
  order (``MlaFamily.hf_rope_deinterleaves``).
- YaRN as in the real V3 config: ``mscale == mscale_all_dim == 1.0`` (HF
  magnitude 1, softmax mscale L(1)^2, which llama.cpp reproduces).
- the router: sigmoid scores with ``e_score_correction_bias``; HF's config class
  has no ``scoring_func`` field, so the tiny config passes it as an extra key
  (kept in config.json, where the converter reads it to write
  ``expert_gating_func``; without it llama.cpp falls back to softmax).

Tiny config: as deepseek_v2's (hidden 64, 3 layers, 4 heads, q/kv lora 24,
nope 12 / rope 8 / v 10, 4 experts), YaRN factor 4 over 128 positions.

``--set rope_interleave=false`` (HF then rotates the raw slice with
rotate-half) runs against HF: impl's MLA takes the rotate-half layout too
(MiniCPM3's, not in mla.rs). It is refused for llama.cpp: deepseek2 always
rotates interleaved pairs (llama-model.cpp llama_model_rope_type:
LLAMA_ROPE_TYPE_NORM) and conversion/deepseek.py neither permutes the rope
slice nor writes a layout key, so the file is another model than HF's.
"""

from __future__ import annotations

from .._mla import MlaFamily, mla_lc_points


class DeepseekV3(MlaFamily):
    name = "deepseek_v3"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("mla", "mla_yarn")}
    hf_model_type = "deepseek_v3"
    description = "MLA (absorbed / naive), low-rank Q, interleaved RoPE (de-interleaved by HF) with YaRN, sigmoid MoE"
    gguf_arch = "deepseek2"
    extra_settable = ("scoring_func", "topk_method")
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", rope_interleave=True,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=128,
                             mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1),
    )
    lc_points = mla_lc_points()

    # apply_rotary_pos_emb_interleave returns the rope slice de-interleaved (with
    # rope_interleave=False the slice is rotate-half'd in place: layout neox, no reorder)
    hf_rope_deinterleaves = True

    def mla_rope_layout(self, config) -> str:
        # modeling_deepseek_v3.py DeepseekV3Attention.forward: apply_rotary_pos_emb_interleave
        # if config.rope_interleave else apply_rotary_pos_emb (rotate-half on the raw slice)
        return "interleaved" if getattr(config, "rope_interleave", True) else "neox"

    def lc_refusal(self, config) -> str | None:
        if not getattr(config, "rope_interleave", True):
            return ("rope_interleave=false: HF rotates the rope slice with rotate-half, llama.cpp's deepseek2 "
                    "always rotates interleaved pairs (LLAMA_ROPE_TYPE_NORM; the converter neither permutes nor "
                    "writes a layout key): run it against --ref hf, or keep rope_interleave=true")
        return super().lc_refusal(config)

    def lc_points_for(self, config, i):
        return self.lc_points

    def gguf_params(self, w, config, variant=None):
        self.deepseek_params(w, config, variant or self.variants[0])


    def mla_router(self, meta, hp):
        # HF DeepseekV3TopkRouter: sigmoid scores plus e_score_correction_bias for the
        # choice, groups by their top-2 sums (llama.cpp build_moe_ffn's too), weights
        # renormalised when norm_topk_prob, times routed_scaling_factor; llama.cpp's
        # deepseek2 defaults to softmax when the file names no gating
        gating = self.deepseek2_gating(meta, hp)
        if gating != 2:
            meta.refuse("expert_gating_func", gating, "HF DeepseekV3 routes by sigmoid (2); llama.cpp's default "
                                                      "for deepseek2 is softmax (sigmoid only for the 47 / 48-layer, "
                                                      "154880-token GLM 4.7 Lite)")
        return dict(topk_method="noaux_tc", scoring_func="sigmoid", rope_interleave=True,
                    norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                    n_group=max(hp.n_expert_groups, 1), topk_group=max(hp.n_group_used, 1),
                    routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0)


FAMILY = DeepseekV3()
