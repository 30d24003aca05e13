"""youtu: DeepSeek V3's multi-head latent attention over a dense FFN (HF
``YoutuForCausalLM``, transformers/models/youtu/modeling_youtu.py: ``YoutuAttention``
is ``DeepseekV3Attention`` -- low-rank Q, the latent RMS norms at eps 1e-6
(``YoutuRMSNorm``'s default), the shared rope slice, ``apply_rotary_pos_emb_interleave``
when ``rope_interleave``, ``yarn_apply_mscale`` for the softmax scale -- and
``YoutuMLP`` on every layer, no experts; llama.cpp arch ``deepseek2``,
src/models/deepseek2.cpp; converter conversion/deepseek.py ``DeepseekV2Model``, which
registers ``YoutuForCausalLM``).

The converter writes a Youtu checkpoint as a deepseek2 file without experts:
``leading_dense_block_count`` = n_layer ("For non-MoE models (like Youtu), set to
n_layer to use dense FFN for all layers"), ``expert_feed_forward_length`` from
``find_hparam(["moe_intermediate_size", "intermediate_size"])`` -- the dense width,
since YoutuConfig has no MoE width -- ``expert_shared_count`` 0 and no expert count;
deepseek2.cpp then builds the dense FFN on every layer.

Tiny config: deepseek_v3's attention sizes (hidden 64, 4 heads, q / kv lora 24, nope
12 / rope 8 / v 10) over 2 layers, plain RoPE (YoutuConfig's default, Youtu-LLM-2B's
config); YaRN is the fuzz space's (``mla_yarn``: mscale == mscale_all_dim, the one
magnitude a deepseek2 file can say).
"""

from __future__ import annotations

from ..deepseek_v3 import DeepseekV3
from .._gguf_import import one_per_layer, special_tokens, vocab_of

class Youtu(DeepseekV3):
    name = "youtu"
    hf_model_type = "youtu"
    description = "DeepSeek V3's MLA (low-rank Q, interleaved RoPE de-interleaved by HF) over a dense FFN (Youtu-LLM)"
    extra_settable = ()  # YoutuConfig routes nothing: no scoring_func / topk_method
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        rope_interleave=True, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )

    def mla_router(self, meta, hp):
        # no router: YoutuMLP on every layer (the file's leading_dense_block_count = n_layer)
        return dict(rope_interleave=True)

    def mla_common(self, meta, shapes, hp) -> dict:
        """deepseek2.cpp's common MLA keys for a file without experts (MlaFamily.mla_common
        reads an MoE's): every layer dense (``leading_dense_block_count`` = n_layer), the
        experts' width the dense width the converter wrote again, no shared experts."""

        vocab = vocab_of(meta, shapes)
        if hp.n_expert:
            meta.refuse("expert_count", hp.n_expert, "experts; YoutuDecoderLayer's YoutuMLP is dense")
        lead = int(meta.get("leading_dense_block_count", 0))
        if lead != hp.n_layer:
            meta.refuse("leading_dense_block_count", lead, f"!= block_count {hp.n_layer}: a Youtu model is dense on "
                                                           "every layer (the converter writes n_layer)")
        width = one_per_layer(meta, "expert_feed_forward_length", hp.n_layer)
        if width != hp.ff:
            meta.refuse("expert_feed_forward_length", width, f"!= feed_forward_length {hp.ff}: the converter "
                                                             "writes the dense width (find_hparam)")
        if int(meta.get("expert_shared_count", 0)):
            meta.refuse("expert_shared_count", meta.get("expert_shared_count"), "shared experts; Youtu has none")
        return dict(
            num_hidden_layers=hp.n_layer, max_position_embeddings=hp.n_ctx_train, hidden_size=hp.n_embd,
            intermediate_size=hp.ff, vocab_size=vocab, tie_word_embeddings="output.weight" not in shapes,
            rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
            **self.mla_sizes(meta, hp), **special_tokens(meta, vocab))


FAMILY = Youtu()
