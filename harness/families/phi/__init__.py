"""phi (phi-1 / phi-2): LayerNorm with bias, Q/K/V and dense biases, partial neox
RoPE, a parallel attention / FFN block, an optional QK LayerNorm WITH a bias (HF
``PhiForCausalLM``; llama.cpp ``src/models/phi2.cpp``, converter
``conversion/phi.py`` ``Phi2Model``).

HF (``modeling_phi.py``):
- ``PhiAttention``: ``q_proj`` / ``k_proj`` / ``v_proj`` / ``dense`` all with bias;
  ``qk_layernorm`` (default False): ``nn.LayerNorm(head_dim, elementwise_affine=True)``
  -- ONE weight and ONE bias shared by every head -- on Q and K before RoPE; RoPE on
  the leading ``rotary_ndims = head_dim * partial_rotary_factor`` channels (default
  0.5), rotate-half.
- ``PhiDecoderLayer.forward``: ``x + attn(ln(x)) + mlp(ln(x))`` (parallel, one
  ``input_layernorm``); ``hidden_act`` "gelu_new" (the tanh form).
- ``PhiForCausalLM``: ``lm_head`` with a bias.

llama.cpp (``phi2.cpp``): ``LLM_NORM`` with bias, ``build_qkv`` (Q / K / V biases),
NEOX RoPE over ``n_rot``, ``Qcur`` scaled by ``1/sqrt(head_dim)`` before
``build_attn`` (scale 1), ``wo_b`` required, the FFN on the same ``attn_norm``,
``l_out = attn + ffn + inpL`` (no name for ``wo``'s product), ``output_b``. No QK
norm slot at all: a ``qk_layernorm`` checkpoint has tensors gguf has no name for
(the export refuses it), so that decoration is judged against HF alone.

Converter (``Phi2Model``): ``head_count_kv = n_head`` and ``feed_forward_length =
4 * n_embd`` whatever the config says (a GQA or non-4x checkpoint is a file
llama.cpp refuses), ``rope.dimension_count = int(rot_pct * n_embd) // n_head``,
no ``rope.freq_base`` (llama.cpp rotates at 10000: a finding for another theta).
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, Point


class Phi(LlamaLike):
    name = "phi"
    hf_model_type = "phi"
    description = "phi-2: LayerNorm, all biases, partial neox RoPE, parallel block, optional QK LayerNorm with bias"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=256, layer_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    gguf_arch = "phi2"
    fuzz_space = {"knobs": ("heads_hidden",)}
    extra_settable = ()
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.final_layernorm", "out")}
    hf_points = {**{k: v for k, v in LlamaLike.hf_points.items() if k != "resid_mid"},
                 "attn_branch": Point("self_attn.dense", "in")}
    # phi2.cpp names neither wo's product nor a residual between (parallel block)
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k not in ("attn_out", "resid_mid")}
    input_norm_kind = "layer"  # PhiDecoderLayer.input_layernorm: nn.LayerNorm (weight and bias)
    weight_map = {**LlamaLike.weight_map, "input_layernorm.bias": "attn_norm_b", "self_attn.dense.weight": "wo",
                  "self_attn.dense.bias": "bo", "self_attn.q_layernorm.weight": "q_norm",
                  "self_attn.q_layernorm.bias": "q_norm_b", "self_attn.k_layernorm.weight": "k_norm",
                  "self_attn.k_layernorm.bias": "k_norm_b"}
    switch_modules = {**LlamaLike.switch_modules, "qk_norm": ("self_attn.q_layernorm", "self_attn.k_layernorm")}
    switch_params = {**LlamaLike.switch_params, "o_bias": ("self_attn.dense.bias",)}
    qk_norm_names = LlamaLike.qk_norm_names + ("q_layernorm.weight", "k_layernorm.weight")

    def norm_eps(self, config) -> float:
        return config.layer_norm_eps

    def head_dim(self, config) -> int:
        return config.hidden_size // config.num_attention_heads

    def layer_config(self, config, i: int):
        lc = super().layer_config(config, i).replace(residual="parallel")
        if config.qk_layernorm:
            # PhiAttention: nn.LayerNorm(head_dim) on every head, one weight and bias for all
            lc = lc.replace(qk_norm=QkNormSpec(NormSpec("layer", config.layer_norm_eps), "head", "pre_rope"))
        return lc

    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/phi.py Phi2Model.set_gguf_parameters (no TextModel super call)
        n_embd, n_head = config.hidden_size, config.num_attention_heads
        rot_pct = config.rope_parameters["partial_rotary_factor"]
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(4 * n_embd)
        w.add_block_count(config.num_hidden_layers)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head)
        w.add_layer_norm_eps(config.layer_norm_eps)
        w.add_rope_dimension_count(int(rot_pct * n_embd) // n_head)

    def gguf_convert(self, name, data, config, variant=None):
        if "_layernorm." in name and ".self_attn." in name:
            # no phi2 tensor for the QK norms (gguf's PHI2 map names none; phi2.cpp has no slot)
            raise ValueError(f"phi: {name} has no place in llama.cpp's phi2 graph (qk_layernorm is HF-only)")
        yield from super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """phi2.cpp load_arch_hparams: the LayerNorm eps; the rotary width from
        rope.dimension_count; MHA and a 4x FFN (what the converter writes)."""
        hp = read_hparams(meta)
        d = hp.n_embd // hp.head
        rp = {"rope_type": "default", "rope_theta": hp.rope_freq_base, "partial_rotary_factor": hp.n_rot / d}
        kw = llama_like_config(self, meta, shapes, hp, rotary=False, rope=rp)
        kw.pop("attention_bias", None)
        kw.update(layer_norm_eps=meta.get_f32("attention.layer_norm_epsilon"), qk_layernorm=False)
        return kw


FAMILY = Phi()
