"""sarvam_mla: Sarvam's MLA model, DeepSeek V3 with direct Q (HF
``SarvamMLAConfig``, transformers/models/sarvam_mla/modular_sarvam_mla.py, a
``DeepseekV3Config`` built as ``DeepseekV3ForCausalLM``: auto/modeling_auto.py;
llama.cpp arch ``deepseek2``, ``src/models/deepseek2.cpp``; converter
conversion/deepseek.py ``DeepseekV2Model``, which the saved
``architectures = ["DeepseekV3ForCausalLM"]`` selects).

The attention is deepseek_v3's (``harness.families.deepseek_v3``: MLA,
interleaved RoPE returned de-interleaved by HF, a sigmoid router with the
score-correction bias), with ``q_lora_rank = None`` (SarvamMLAConfig's
default): Q is one ``q_proj`` (impl's direct Q, llama.cpp's ``wq``).

The trap: the converter writes ``attention.q_lora_rank`` only when
``q_lora_rank`` is set, and deepseek2.cpp ``load_arch_hparams`` REQUIRES it
unless the layer count makes the model "lite" (26 or 27 layers, or 48 with a
128256 vocabulary): a converted Sarvam-MLA file at any other depth (the config
default is 32) does not load. The export writes ``q_lora_rank = 0``, the value
the loader's lite path assumes (``MlaFamily.direct_q_rank_key``, as for
deepseek_v2's direct-Q setting); the test shows both sides of the switch.

``--gguf``: a sarvam_mla file IS a deepseek_v3 file (the same HF model class
and graph), read as deepseek_v3 unless ``--family sarvam_mla``.

Tiny config: deepseek_v3's (hidden 64, 3 layers, 4 heads, kv_lora_rank 24,
nope 12 / rope 8 / v 10, 4 experts, 2 used, 1 shared, layer 0 dense), direct
Q, plain RoPE (SarvamMLAConfig's default).
"""

from __future__ import annotations

from ..deepseek_v3 import DeepseekV3


class SarvamMla(DeepseekV3):
    name = "sarvam_mla"
    hf_model_type = "sarvam_mla"
    description = "DeepSeek V3's MLA with direct Q (Sarvam), sigmoid MoE"
    gguf_reads_as = "deepseek_v3"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("mla",)}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=None, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        # as deepseek_v3's: the converter reads scoring_func from config.json (expert_gating_func);
        # the config class has no such field, so it is passed as an extra key
        scoring_func="sigmoid", topk_method="noaux_tc", rope_interleave=True,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


FAMILY = SarvamMla()
