"""phimoe: Phi-3.5-MoE -- phi3's RoPE (LongRoPE where configured) on separate
Q/K/V projections with biases, LayerNorm with bias, and experts routed by
sparsemixer (HF ``PhimoeForCausalLM``, transformers/models/phimoe/
modeling_phimoe.py; llama.cpp arch ``phimoe``: src/models/phimoe.cpp loads the
tensors, the graph is phi3's (models.h: ``using graph =
llama_model_phi3::graph<iswa>``, src/models/phi3.cpp); converter
conversion/phi.py ``PhiMoeModel(Phi3MiniModel)``).

HF:
- ``PhimoeDecoderLayer``: ``input_layernorm`` / ``post_attention_layernorm``
  are ``nn.LayerNorm(hidden, eps=config.rms_norm_eps)`` -- mean-centred, weight
  and bias -- and so is ``PhimoeModel.norm``; ``lm_head`` has a bias
  (``lm_head_bias``), the four projections too (``attention_bias``);
  Phi-3.5-MoE-instruct's config.json sets both true.
- ``PhimoeTopKRouter`` -> ``sparsemixer`` (eval): the first expert is the
  arg-max, its weight the softmax over the logits within ``2 *
  router_jitter_noise`` (relative) of the max; the second the arg-max of the
  rest, its weight the softmax over the logits within the same distance of IT
  (the first masked out). The two weights are not normalised together: with
  well-separated logits each is ~1.

llama.cpp (phi3.cpp, the graph phimoe runs): ``build_norm(inpL, attn_norm,
attn_norm_b, LLM_NORM_RMS, il)`` -- an RMS norm plus the bias where HF
mean-centres -- and the same for ``ffn_norm`` and ``output_norm``;
``build_moe_ffn(..., LLM_FFN_SILU, true, ..., SOFTMAX)``: softmax over all
experts, top-k, renormalised. Both are findings (findings.toml), each
bounded by its measured size. ``attn_out`` / ``resid_mid`` carry no name (as
phi3). phimoe.cpp ``load_arch_tensors`` requires ``attn_output.bias`` and
``output.bias``, so a file without the biases does not load.

Converter (``PhiMoeModel``): ``Phi3MiniModel``'s keys (the LongRoPE factor
tensors and attention factor from the two lengths), then the expert counts;
the per-expert ``w1 / w2 / w3`` stacked (transformers 5 holds them fused,
``mlp.experts.gate_up_proj``, gate rows first; ``mlp.router`` is the
checkpoint's ``block_sparse_moe.gate``: conversion_mapping.py "phimoe").

Tiny config: 2 layers, 4 heads, 2 KV heads, 4 experts of 32 (2 used), both
bias switches on (the released model's), plain RoPE (phi3's LongRoPE is the
phi3 family's test; Phimoe's rotary takes its ``short_mscale`` /
``long_mscale``, which the converter does not read: not covered here).
"""

from __future__ import annotations

from .._gguf_import import experts, read_hparams
from ..base import LlamaLike, gguf_moe_convert
from ..phi3 import Phi3


class Phimoe(Phi3):
    name = "phimoe"
    hf_model_type = "phimoe"
    description = "phi3's RoPE with QKV / o / head biases, LayerNorm (llama.cpp: RMS + bias), sparsemixer experts"
    fuzz_space = {"knobs": ("heads", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        original_max_position_embeddings=256,  # top-level, as Phi-3.5-MoE's config.json (the converter reads it)
        num_local_experts=4, num_experts_per_tok=2, attention_bias=True, lm_head_bias=True,
        sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    gguf_arch = "phimoe"
    # PhimoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    # PhimoeAttention: separate q_proj / k_proj / v_proj (phi3 fuses them)
    hf_points = LlamaLike.hf_points
    input_norm_kind = "layer"  # PhimoeDecoderLayer: nn.LayerNorm, weight and bias
    weight_map = {**LlamaLike.weight_map, "input_layernorm.bias": "attn_norm_b"}
    layer_weights = LlamaLike.layer_weights
    _has_experts = True
    # PhimoeConfig has no head_dim field (PhimoeAttention reads it with getattr); phimoe.cpp
    # shapes wq as {n_embd, n_embd} (head_dim = hidden / heads): not offered
    extra_settable = ()

    def head_dim(self, config) -> int:
        # PhimoeAttention: getattr(config, "head_dim", hidden // heads)
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def hf_canonical(self, probe, arr, lc):
        return LlamaLike.hf_canonical(self, probe, arr, lc)

    def lc_refusal(self, config) -> str | None:
        # phimoe.cpp load_arch_tensors: attn_output.bias and output.bias are required
        if not (config.attention_bias and config.lm_head_bias):
            return ("attention_bias and lm_head_bias must be true against llama.cpp: phimoe.cpp loads "
                    "attn_output.bias and output.bias as required tensors; run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/phi.py PhiMoeModel.set_gguf_parameters: Phi3MiniModel's, then the experts
        super().gguf_params(w, config, variant)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_count(config.num_local_experts)

    def gguf_convert(self, name, data, config, variant=None):
        # PhiMoeModel.modify_tensors stacks w1 / w3 / w2; transformers 5 holds them fused
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """phimoe.cpp load_arch_hparams: the RMS eps (HF's LayerNorm eps) and phi3's RoPE;
        the file's biases are required, so HF's two bias switches are on."""
        if "rope_factors_long.weight" in tensors:
            # PhimoeRotaryEmbedding.forward multiplies cos / sin by rope_parameters' short_mscale /
            # long_mscale, which no GGUF key carries (Phi3MiniModel writes rope.scaling.attn_factor
            # from the two lengths)
            meta.refuse("rope_factors_long.weight", "present", "LongRoPE: HF Phimoe's rotary needs short_mscale / "
                        "long_mscale, which the file does not carry")
        kw = super().config_from_gguf(meta, shapes, tensors)
        n_exp, n_used = experts(meta, read_hparams(meta), self.name)
        kw.update(num_local_experts=n_exp, num_experts_per_tok=n_used, attention_bias=True, lm_head_bias=True)
        return kw


FAMILY = Phimoe()
