"""deepseek_v2: multi-head latent attention with low-rank Q and YaRN (HF
``DeepseekV2ForCausalLM``, modeling_deepseek_v2.py ``DeepseekV2Attention``;
llama.cpp arch ``deepseek2``, src/models/deepseek2.cpp; converter
conversion/deepseek.py ``DeepseekV2Model``).

The MLA layer (``impl.mla``) in the family's two variants:
- ``absorbed`` (default): impl splits ``kv_b`` as the converter does and runs
  the absorbed form; the GGUF is the converter's (``attn_k_b`` / ``attn_v_b``,
  the ``_mla`` keys), so llama.cpp runs its ``is_mla()`` graph -- MQA over the
  latent cache.
- ``naive``: impl runs the combined ``kv_b`` form; the GGUF is the legacy file
  llama.cpp still loads on its ``!is_mla()`` path (``attn_kv_b`` unsplit, no
  ``_mla`` keys, MHA head metadata), so llama.cpp runs its naive graph too.

Decorations: low-rank Q (``q_a`` -> RMS norm -> ``q_b``), the shared rope slice
of ``kv_a_proj_with_mqa``, the latent RMS norm, interleaved RoPE on the
decoupled slices (HF ``apply_rotary_emb``: complex pairs, output stays
interleaved -- the canonical order), YaRN (per-band frequencies, magnitude on
the rotated channels, ``mscale_all_dim``'s square in the softmax scale), the
unabsorbed head width in ``kq_scale``, ``qk_head_dim != v_head_dim``.

Tiny config: hidden 64, 3 layers (layer 0 dense, 1-2 MoE with 4 experts, 2
used, 1 shared), 4 heads, q_lora_rank 24, kv_lora_rank 24, nope 12 / rope 8 /
v 10, YaRN factor 4 over 128 original positions with ``mscale ==
mscale_all_dim == 0.707`` (HF magnitude 1, softmax mscale L(0.707)^2; llama.cpp
agrees only when the two are equal, see below); ``inv_freq = [1, 0.0625,
0.0025, 0.00025]``: one extrapolated band, one mixed, two interpolated.
``rms_norm_eps = 1e-6``: HF's latent norms use 1e-6 whatever it says.

HF-only configs (each measured against llama.cpp, a ``[[finding]]`` in
fixtures/tolerance.toml):
- ``--set rope_parameters.mscale=1.0`` (mscale != mscale_all_dim): HF's rope
  magnitude is L(1)/L(0.707); llama.cpp's deepseek2 uses 1 whenever the file
  has ``yarn_log_multiplier`` (llama-context.cpp: "here we assume mscale ==
  1.0f" with the deepseek2 special case ``mscale = mscale_all_dims``).
- ``--set q_lora_rank=null``: direct Q (``q_proj``); llama.cpp agrees once the
  GGUF carries ``deepseek2.attention.q_lora_rank = 0`` (the converter omits
  it, and llama.cpp then refuses the file -- the export adds it, see
  ``MlaFamily.deepseek_params``).
"""

from __future__ import annotations

from .._mla import MlaFamily, mla_lc_points


class DeepseekV2(MlaFamily):
    name = "deepseek_v2"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("mla", "mla_yarn")}
    hf_model_type = "deepseek_v2"
    description = "MLA (absorbed / naive), low-rank Q, interleaved RoPE with YaRN, MoE"
    gguf_arch = "deepseek2"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        # HF V2's router never renormalises (norm_topk_prob unused); llama.cpp would if the
        # converter wrote expert_weights_norm, which it does only for norm_topk_prob=True
        topk_method="greedy", routed_scaling_factor=1.0, norm_topk_prob=False,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=128,
                             mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1),
    )
    lc_points = mla_lc_points()

    def lc_points_for(self, config, i):
        return self.lc_points

    def gguf_params(self, w, config, variant=None):
        self.deepseek_params(w, config, variant or self.variants[0])


    def mla_router(self, meta, hp):
        # HF DeepseekV2Moe (topk_method "greedy"): softmax scores, top-k, never
        # renormalised, times routed_scaling_factor; llama.cpp's default gating for
        # deepseek2 is softmax (deepseek2.cpp), its grouped selection DeepSeek V3's
        # top-2 sums, which V2's group_limited_greedy (group max) is not
        gating = self.deepseek2_gating(meta, hp)
        if gating != 1:
            meta.refuse("expert_gating_func", gating, "HF DeepseekV2 routes by softmax (1)")
        if meta.get("expert_weights_norm", False):
            meta.refuse("expert_weights_norm", True, "HF DeepseekV2's router never renormalises its top-k weights")
        if hp.n_expert_groups > 1:
            meta.refuse("expert_group_count", hp.n_expert_groups, "llama.cpp selects groups by their top-2 sum "
                        "(DeepSeek V3), HF DeepseekV2's group_limited_greedy by their maximum")
        return dict(topk_method="greedy", norm_topk_prob=False,
                    routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0)


FAMILY = DeepseekV2()
