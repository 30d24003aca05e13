"""cohere (Command-R): a parallel attention / FFN block, a bias-free LayerNorm,
interleaved RoPE on every layer, optional QK LayerNorms with one weight per head,
a logit scale (HF ``CohereForCausalLM``; llama.cpp ``src/models/command-r.cpp``,
converter ``conversion/command_r.py`` ``CommandR2Model``).

HF (``modeling_cohere.py``):
- ``CohereDecoderLayer.forward``: ``h = input_layernorm(x)``; ``x + self_attn(h) +
  mlp(h)`` (no residual between attention and FFN).
- ``CohereLayerNorm``: mean-centred, a weight and no bias, in float32 -- for the
  QK norms shaped ``(num_heads, head_dim)`` / ``(num_kv_heads, head_dim)``: each
  head normalised over its ``head_dim`` with its own weight row.
- ``CohereAttention.forward``: ``q_norm`` / ``k_norm`` on ``q_proj(x).view(...,
  head_dim)`` when ``use_qk_norm`` (default False), then RoPE in interleaved pairs
  (``rotate_half`` of ``x[..., ::2]`` / ``x[..., 1::2]``).
- ``CohereForCausalLM.forward``: ``logits * logit_scale``.

llama.cpp (``command-r.cpp``): ``LLM_NORM`` without bias, ``LLAMA_ROPE_TYPE_NORM``
(interleaved: no permutation), the FFN on the same ``attn_norm``, ``l_out =
ffn_out + inpL + attn_out`` (no name for ``wo``'s product, no residual between),
``output`` always ``token_embd``, ``ggml_scale(logit_scale)``. The QK norms
(``attn_q_norm {n_embd_head_k, n_head}``, LLM_NORM, before RoPE) are created ONLY
``if (n_layer >= 64)`` -- a file with them and fewer layers is refused ("wrong
number of tensors"), and a 64-layer file without them too: the switch is the
depth, not ``use_qk_norm``. A ``Qcur`` is named after the QK norm as well as
before it, so ``q`` / ``k`` are read at ``build_qkv``'s reshape (llama4's way).

GGUF (``CommandR2Model``): ``TextModel.set_gguf_parameters`` (the generic keys,
``rope.freq_base`` among them), ``logit_scale``, ``rope.scaling.type = none``;
``max_position_embeddings`` replaced by ``model_max_length`` where the config has it.
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, LcPoint, text_model_gguf_params
from harness.lazy import lazy

gguf = lazy("gguf")

# command-r.cpp load_arch_tensors: attn_q_norm / attn_k_norm only `if (n_layer >= 64)`
QK_NORM_MIN_LAYERS = 64


class Cohere(LlamaLike):
    name = "cohere"
    hf_model_type = "cohere"
    description = "Command-R: parallel block, bias-free LayerNorm, interleaved RoPE, per-head QK LayerNorm (>= 64 layers)"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        layer_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        logit_scale=0.25, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "command-r"
    fuzz_space = {"knobs": ("heads", "theta")}
    extra_settable = ()
    # no resid_mid: residual + attn + mlp is one expression (parallel block)
    hf_points = {k: v for k, v in LlamaLike.hf_points.items() if k != "resid_mid"}
    lc_points = {**{k: v for k, v in LlamaLike.lc_points.items() if k not in ("attn_out", "resid_mid")},
                 # command-r.cpp names the QK-normed Q / K "Qcur" / "Kcur" too: q / k are build_qkv's
                 # reshape of the projection (after any bias), before the norm
                 "q": LcPoint("Qcur", "op:RESHAPE", "heads"), "k": LcPoint("Kcur", "op:RESHAPE", "heads")}
    input_norm_kind = "layer"  # CohereLayerNorm: weight, no bias
    rope_layout = "interleaved"  # CohereAttention: rotate_half on x[..., ::2] / x[..., 1::2]

    def norm_eps(self, config) -> float:
        return config.layer_norm_eps

    def head_dim(self, config) -> int:
        return config.hidden_size // config.num_attention_heads  # CohereAttention.head_dim

    def layer_config(self, config, i: int):
        lc = super().layer_config(config, i).replace(residual="parallel")
        if config.use_qk_norm:
            # CohereLayerNorm((num_heads, head_dim)): mean-centred over head_dim, a weight per head
            lc = lc.replace(qk_norm=QkNormSpec(NormSpec("layer", config.layer_norm_eps), "head", "pre_rope",
                                               per_head=True))
        return lc

    def init_value(self, name, p, r):
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            # the [heads, head_dim] QK norm weights: around HF's ones, as every norm weight
            # (Family.init_value would draw a 2-D parameter as a projection)
            return p.detach().to(r.dtype) + 0.1 * r
        return super().init_value(name, p, r)

    def gguf_params(self, w, config, variant=None):
        # conversion/command_r.py CommandR2Model: max_position_embeddings replaced by
        # model_max_length where the config has one (HF's CohereConfig has none)
        text_model_gguf_params(w, config)
        w.add_logit_scale(config.logit_scale)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)

    def config_from_gguf(self, meta, shapes, tensors):
        """command-r.cpp load_arch_hparams: logit_scale (optional) and the LayerNorm eps;
        the QK norms are what the file carries (llama.cpp loads them at >= 64 layers)."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp)
        kw.pop("tie_word_embeddings", None)
        kw.update(layer_norm_eps=meta.get_f32("attention.layer_norm_epsilon"),
                  logit_scale=meta.get_f32("logit_scale", 0.0) or None,
                  use_qk_norm="blk.0.attn_q_norm.weight" in shapes,
                  tie_word_embeddings=True)  # command-r.cpp: output is always token_embd
        return kw


FAMILY = Cohere()
