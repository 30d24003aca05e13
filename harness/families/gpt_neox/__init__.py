"""gpt_neox: a per-head interleaved fused QKV with biases, partial neox RoPE,
LayerNorm with biases and a parallel block by default (HF ``GPTNeoXForCausalLM``;
llama.cpp ``src/models/gptneox.cpp``, converter ``conversion/gptneox.py``
``GPTNeoXModel``).

HF (``modeling_gpt_neox.py``):
- ``GPTNeoXAttention.forward``: ``qkv = query_key_value(x).view(..., -1, 3 *
  head_size)``, ``chunk(3, dim=-1)`` -- per head ``[q | k | v]`` (bloom's layout);
  ``apply_rotary_pos_emb`` rotates the leading ``rotary_ndims = head_size *
  partial_rotary_factor`` channels rotate-half; ``dense`` (o_proj) with bias;
  ``attention_bias`` (default True) switches both biases.
- ``GPTNeoXConfig.convert_rope_params_to_dict``: the old ``rotary_pct`` (default
  0.25) and ``rotary_emb_base`` (10000) become ``rope_parameters``'
  ``partial_rotary_factor`` / ``rope_theta``.
- ``GPTNeoXLayer.forward``: ``use_parallel_residual`` (default True): ``x +
  attention(ln1(x)) + mlp(ln2(x))`` -- no residual between attention and FFN;
  else sequential.

llama.cpp (``gptneox.cpp``): ``LLM_NORM`` with bias, ``build_qkv`` views of the
fused ``wqkv`` + ``wqkv_b`` (both required, as are ``wo_b`` and the FFN biases),
``ggml_rope_ext`` NEOX over ``n_rot``, ``kq_scale = 1/sqrt(head_dim)``;
``use_par_res`` from ``use_parallel_residual``: parallel -> ``l_out = ffn_out +
inpL + attn_out`` (nothing named between), sequential -> ``ffn_inp``.

Converter (``GPTNeoXModel``): reorders ``query_key_value`` (weight and bias) from
per-head interleaved to ``[Q; K; V]`` (``_convert.per_head_qkv_to_blocks``);
writes ``rope.dimension_count = int(rotary_pct * head_size)`` -- from
``hparams["rotary_pct"]``, a key a transformers-5 ``config.json`` no longer has
(the converter would raise KeyError on it; we write what it means, from
``partial_rotary_factor``: ``ROTARY_FROM``) -- and NO ``rope.freq_base`` and no
``head_count_kv``: llama.cpp rotates at its default base 10000 whatever HF's
``rope_theta`` is (a finding).
"""

from __future__ import annotations

import numpy as np

from contract.layers import LayerConfig, NormSpec

from .._convert import per_head_qkv_split, per_head_qkv_to_blocks
from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of
from ..base import Family, LcCapture, Point, rope_from_config, tensor


class GPTNeoX(Family):
    name = "gpt_neox"
    hf_model_type = "gpt_neox"
    description = "per-head interleaved fused QKV with biases, partial neox RoPE, LayerNorm, parallel block"
    tiny = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=256, layer_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                bos_token_id=0, eos_token_id=2, pad_token_id=1, tie_word_embeddings=False)
    gguf_arch = "gptneox"
    fuzz_space = {"knobs": ("heads_hidden",)}
    layers_path = "gpt_neox.layers"
    size_keys = {"hidden": "hidden_size", "heads": "num_attention_heads", "layers": "num_hidden_layers"}
    hf_model_points = {"embeddings": ("gpt_neox.embed_in", "out"), "final_norm": ("gpt_neox.final_layer_norm", "out")}
    _reorder_qkv = True  # what the converter does; a test switches it off
    # the converter's rope.dimension_count: from partial_rotary_factor (what its rotary_pct
    # meant); a test writes the whole head instead to show llama.cpp reads the key
    _rotary_from_config = True
    _qkv = Point("attention.query_key_value", "out")
    _points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("attention", "in"),
        "q": _qkv, "k": _qkv, "v": _qkv,
        "attn_branch": Point("attention.dense", "in"),
        "attn_out": Point("attention.dense", "out"),
        "layer_out": Point("", "out"),
    }
    switch_modules = {"input_norm": ("input_layernorm",)}

    def _parallel(self, config) -> bool:
        return bool(config.use_parallel_residual)

    def hf_points_for(self, config, i: int):
        if self._parallel(config):  # x + attn + mlp in one expression: no residual between
            return self._points
        return {**self._points, "resid_mid": Point("post_attention_layernorm", "in")}

    def lc_points_for(self, config, i: int):
        # gptneox.cpp: build_attn's wo product carries no name; ffn_inp only when sequential
        pts = {k: v for k, v in LcCapture.lc_points.items() if k not in ("attn_out", "resid_mid")}
        if not self._parallel(config):
            pts["resid_mid"] = LcCapture.lc_points["resid_mid"]
        return pts

    def layer_config(self, config, i: int) -> LayerConfig:
        h, nh = config.hidden_size, config.num_attention_heads
        d = h // nh  # GPTNeoXAttention.head_size
        return LayerConfig(
            hidden_size=h, n_heads=nh, n_kv_heads=nh, head_dim=d,
            input_norm=NormSpec("layer", config.layer_norm_eps),  # GPTNeoXLayer.input_layernorm
            rope=rope_from_config(config, layout="neox", head_dim=d),
            residual="parallel" if self._parallel(config) else "sequential",
        )

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        nh = config.num_attention_heads
        w = {"attn_norm": tensor(layer, "input_layernorm.weight"), "attn_norm_b": tensor(layer, "input_layernorm.bias"),
             "wo": tensor(layer, "attention.dense.weight")}
        w["wq"], w["wk"], w["wv"] = per_head_qkv_split(tensor(layer, "attention.query_key_value.weight"), nh)
        b = tensor(layer, "attention.query_key_value.bias")
        if b is not None:
            w["bq"], w["bk"], w["bv"] = per_head_qkv_split(b, nh)
        bo = tensor(layer, "attention.dense.bias")
        if bo is not None:
            w["bo"] = bo
        return w

    def hf_canonical(self, probe, arr, lc):
        if probe in ("q", "k", "v") and arr.ndim == 3:
            # GPTNeoXAttention.forward: view(..., n_head, 3 * head_size).chunk(3, -1)
            j = {"q": 0, "k": 1, "v": 2}[probe]
            return arr.reshape(*arr.shape[:2], lc.n_heads, 3, lc.head_dim)[:, :, :, j, :]
        return super().hf_canonical(probe, arr, lc)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/gptneox.py GPTNeoXModel.set_gguf_parameters (no TextModel super call)
        h, nh = config.hidden_size, config.num_attention_heads
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(h)
        w.add_block_count(config.num_hidden_layers)
        w.add_feed_forward_length(config.intermediate_size)
        prf = config.rope_parameters.get("partial_rotary_factor", 1.0) if self._rotary_from_config else 1.0
        w.add_rope_dimension_count(int(prf * (h // nh)))  # int(rotary_pct * head_size)
        w.add_head_count(nh)
        w.add_parallel_residual(bool(config.use_parallel_residual))
        w.add_layer_norm_eps(config.layer_norm_eps)

    def gguf_convert(self, name, data, config, variant=None):
        if self._reorder_qkv and name.endswith(("attention.query_key_value.weight", "attention.query_key_value.bias")):
            data = per_head_qkv_to_blocks(data, config.num_attention_heads)
        yield name, np.ascontiguousarray(data)

    def config_from_gguf(self, meta, shapes, tensors):
        """gptneox.cpp load_arch_hparams: the LayerNorm eps and use_parallel_residual;
        the RoPE base llama.cpp uses is its default unless the file says otherwise
        (read_hparams), the rotary width ``rope.dimension_count``."""
        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        if hp.head_kv != hp.head:
            meta.refuse("attention.head_count_kv", hp.head_kv, f"KV groups; HF GPTNeoX's fused QKV is multi-head "
                                                            f"({hp.head} heads)")
        d = hp.n_embd // hp.head
        if hp.n_embd_head_k != d or hp.n_embd_head_v != d:
            meta.refuse("attention.key_length", hp.n_embd_head_k, f"HF GPTNeoX fixes head_size = hidden / heads = {d}")
        if hp.rope_scaling_type not in ("none", "linear") or hp.rope_freq_scale != 1.0 or hp.rope_attn_factor != 1.0:
            meta.refuse("rope.scaling.type", hp.rope_scaling_type, "RoPE scaling; the gptneox converter writes none")
        if "blk.0.attn_qkv.bias" not in shapes:
            raise ValueError("gptneox needs blk.N.attn_qkv.bias (llama.cpp loads it as required)")
        vocab = vocab_of(meta, shapes)
        return {"vocab_size": vocab, "hidden_size": hp.n_embd, "num_hidden_layers": hp.n_layer,
                "num_attention_heads": hp.head, "intermediate_size": hp.ff, "max_position_embeddings": hp.n_ctx_train,
                "layer_norm_eps": meta.get_f32("attention.layer_norm_epsilon"),
                "use_parallel_residual": bool(meta.get("use_parallel_residual")),
                "rope_parameters": {"rope_type": "default", "rope_theta": hp.rope_freq_base,
                                    "partial_rotary_factor": hp.n_rot / d},
                "attention_bias": True, "tie_word_embeddings": False, **special_tokens(meta, vocab)}


FAMILY = GPTNeoX()
