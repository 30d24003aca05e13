"""gemma: Gemma 1 -- ``(1 + w)`` RMS norms and a ``sqrt(hidden)`` embedding
scale on llama's attention (HF ``GemmaForCausalLM``,
transformers/models/gemma/modeling_gemma.py; llama.cpp ``src/models/gemma.cpp``;
converter conversion/gemma.py ``GemmaModel``).

HF: ``GemmaRMSNorm``: ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` in float32;
``GemmaTextScaledWordEmbedding`` multiplies the embedding by ``sqrt(hidden)``
inside ``embed_tokens``; ``GemmaAttention``: neox RoPE, scale
``head_dim ** -0.5``, ``attention_bias`` on all four projections.

llama.cpp: gemma.cpp scales the embedding (``inp_scaled``), scales Q by
``1/sqrt(n_embd_head)`` after RoPE (``Qcur_scaled``) and calls ``build_attn``
with scale 1 and no ``wo_b`` (an o_proj bias is a tensor the loader refuses:
``attention_bias`` is HF-only); no ``attn_out`` name, ``sa_out`` the residual
after attention. The output is always ``token_embd`` (tied).

The converter (``GemmaModel``): its own ``set_gguf_parameters`` without
``super()`` -- context, sizes, heads, the RMS eps and key / value lengths,
NO RoPE key at all, so llama.cpp rotates at its default base 10000 whatever
``rope_theta`` HF has (a ``[[finding]]``, findings.toml; Gemma 1's theta is
10000); ``lm_head.weight`` dropped; every ``*norm.weight`` stored as ``w + 1``
(``NormPlusOne``).

Tiny config: head_dim 16, 4 heads, 2 KV heads (Gemma-2B is MQA: a test runs
one KV head), theta 10000.
"""

from __future__ import annotations

from .._gguf_export import NormPlusOne
from .._gguf_import import llama_like_config, read_hparams
from ..base import LcPoint, LlamaLike


def gemma_gguf_params(w, config) -> None:
    """conversion/gemma.py GemmaModel.set_gguf_parameters, key for key (no super(): no
    rope.freq_base, no rope scaling); Gemma2Model.set_gguf_parameters writes the same
    keys before its softcaps and window (gemma2 calls this)."""
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)


class Gemma(NormPlusOne, LlamaLike):
    name = "gemma"
    hf_model_type = "gemma"
    description = "(1+w) RMS norms, sqrt(hidden) embedding scale, converter writes no RoPE theta"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,  # gemma.cpp: the output is token_embd
    )
    gguf_arch = "gemma"
    input_norm_kind = "rms1p"  # GemmaRMSNorm: (1 + w)
    # gemma.cpp: the scaled embedding is `inp_scaled` (`embd` is not scaled); no name on
    # the wo product; `sa_out` the residual after attention
    lc_model_points = {**LlamaLike.lc_model_points, "embeddings": LcPoint("inp_scaled")}
    lc_points = {**{k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"},
                 "resid_mid": LcPoint("sa_out")}

    def gguf_params(self, w, config, variant=None):
        gemma_gguf_params(w, config)

    def gguf_transform(self, name, data, config):
        if name == "lm_head.weight":  # GemmaModel.filter_tensors: skipped
            return None
        return data  # GemmaModel.modify_tensors: norms + 1 (NormPlusOne)

    def config_from_gguf(self, meta, shapes, tensors):
        # gemma.cpp load_arch_hparams: the RMS eps; the output is token_embd
        kw = llama_like_config(self, meta, shapes, read_hparams(meta))
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), tie_word_embeddings=True)
        return kw


FAMILY = Gemma()
