"""glm4_moe_lite: GLM-4.7-Flash, DeepSeek V3's MLA with GLM-4.5's MoE (HF
``Glm4MoeLiteForCausalLM``, transformers/models/glm4_moe_lite/
modular_glm4_moe_lite.py: ``Glm4MoeLiteAttention(DeepseekV3Attention)``, the
router ``Glm4MoeTopkRouter``; llama.cpp arch ``deepseek2``,
``src/models/deepseek2.cpp``; converter conversion/glm.py
``Glm4MoeLiteModel(DeepseekV2Model)``).

The attention is deepseek_v3's (``harness.families.deepseek_v3``: MLA, low-rank
Q, interleaved RoPE that HF returns de-interleaved). The MoE: sigmoid scores
plus ``e_score_correction_bias`` for the choice, groups by their top-2 sums,
``norm_topk_prob``, ``routed_scaling_factor`` -- deepseek_v3's router; the
dense layers are ``config.mlp_layer_types`` (``Glm4MoeLiteConfig.__post_init__``:
the first dense, the rest sparse).

Two traps, both where the converter reads config.json keys HF's config class
does not define:
- ``first_k_dense_replace``: HF places its dense layers by ``mlp_layer_types``;
  the converter writes ``leading_dense_block_count`` from
  ``first_k_dense_replace`` (conversion/deepseek.py ``DeepseekV2Model.
  set_gguf_parameters``: absent, 0 for an MoE) -- without it llama.cpp expects
  experts in layer 0 and refuses the file. The hub config carries it (1); so
  does the tiny config, as an extra key.
- the gating function: the converter writes ``expert_gating_func`` only when
  config.json names ``scoring_func`` (conversion/base.py
  ``TextModel.set_gguf_parameters``), and deepseek2.cpp ``load_arch_hparams``
  then falls back to SOFTMAX -- except for "GLM 4.7 Lite", which it recognises
  by ``n_layer in (47, 48) and n_vocab == 154880`` and routes by sigmoid. HF
  always routes by sigmoid. A config without ``scoring_func`` at any other
  depth or vocabulary is a different model in llama.cpp (a ``[[finding]]``,
  findings.toml; the test runs both sides of the switch). The tiny config
  names ``scoring_func = "sigmoid"`` (as deepseek_v3's does), so the default
  case agrees.

``--gguf``: a GLM-4.7-Flash file is a deepseek2 file with sigmoid routing --
the model ``DeepseekV3ForCausalLM`` computes (deepseek_v3's reverse reads it,
the gating guess included: ``MlaFamily.deepseek2_gating``), read as this family
with ``--family glm4_moe_lite``; softmax routing is refused (HF's router is
sigmoid).

Tiny config: hidden 64, 3 layers (dense, MoE, MoE), 4 heads, q_lora_rank 24,
kv_lora_rank 24, nope 12 / rope 8 / v 10, 4 experts, 2 used, 1 shared,
plain RoPE (Glm4MoeLiteConfig's default).
"""

from __future__ import annotations

from ..deepseek_v3 import DeepseekV3

class Glm4MoeLite(DeepseekV3):
    name = "glm4_moe_lite"
    hf_model_type = "glm4_moe_lite"
    description = "DeepSeek V3's MLA with GLM-4.5's sigmoid MoE (GLM-4.7-Flash)"
    gguf_reads_as = "deepseek_v3"  # the same model as DeepseekV3ForCausalLM computes, on the same graph
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("mla",)}
    # config.json keys the converter reads that Glm4MoeLiteConfig does not define (see above)
    extra_settable = ("scoring_func", "first_k_dense_replace")
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True,
        first_k_dense_replace=1, scoring_func="sigmoid", rope_interleave=True,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,  # see the docstring: 1e-5 is a finding
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )

    def mla_router(self, meta, hp):
        # deepseek_v3's router, read as deepseek2.cpp does (MlaFamily.deepseek2_gating: the
        # GLM 4.7 Lite guess for a file without a gating key included)
        kw = super().mla_router(meta, hp)
        kw.pop("topk_method", None)  # Glm4MoeTopkRouter has no topk_method
        return kw

    def config_from_gguf(self, meta, shapes, tensors):
        kw = super().config_from_gguf(meta, shapes, tensors)
        # HF places the dense layers by mlp_layer_types; llama.cpp by leading_dense_block_count
        lead = kw["first_k_dense_replace"]
        kw["mlp_layer_types"] = ["dense" if i < lead else "sparse" for i in range(kw["num_hidden_layers"])]
        return kw


FAMILY = Glm4MoeLite()
