"""gpt2: learned absolute positions (no RoPE), a fused ``[Q | K | V]`` projection
stored as ``Conv1D`` (``[in, out]``), LayerNorm with bias, biases everywhere
(HF ``GPT2LMHeadModel``; llama.cpp ``src/models/gpt2.cpp``, converter
``conversion/gpt2.py`` ``GPT2Model``).

HF (``modeling_gpt2.py``):
- ``GPT2Model.forward``: ``wte(ids) + wpe(positions)`` (dropout: identity in
  eval) -- what layer 0 reads, compared as ``embeddings``.
- ``GPT2Attention.forward``: ``c_attn(x).split(n_embd, dim=2)`` -> Q, K, V
  (``Conv1D``: ``x @ W + b`` with ``W`` ``[in, out]``), ``eager_attention_forward``
  with ``scaling = head_dim ** -0.5`` (``scale_attn_weights``; divided by
  ``layer_idx + 1`` under ``scale_attn_by_inverse_layer_idx``, default False),
  ``c_proj`` (with bias).
- ``GPT2Block``: ``ln_1`` -> attention -> residual -> ``ln_2`` -> MLP
  (``activation_function`` "gelu_new", the tanh form) -> residual.

llama.cpp (``gpt2.cpp``): ``inpL = tok_embd[ids] + pos_embd[pos]`` (named
``inpL``), ``LLM_NORM`` with bias, ``build_qkv`` views of ``wqkv`` + ``wqkv_b``, no
RoPE, ``kq_scale = 1/sqrt(head_dim)`` on every layer, ``wo_b``, ``ffn_inp``; the
FFN's ``ggml_gelu`` from an fp16 table (a finding, the FFN half).

Converter (``GPT2Model.modify_tensors``): ``c_attn`` / ``c_proj`` / ``c_fc``
weights transposed (``Conv1D`` -> ``[out, in]``); ``feed_forward_length = 4 *
n_embd`` whatever ``n_inner`` says; the context from ``n_ctx`` (transformers 5:
``n_positions``, which sizes ``pos_embd``).
"""

from __future__ import annotations

import numpy as np

from contract.layers import LayerConfig, NormSpec

from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of
from ..base import FUSED_QKV_NOPE_LC_POINTS, Family, LcCapture, LcPoint, Point, tensor

_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


class GPT2(Family):
    name = "gpt2"
    hf_model_type = "gpt2"
    description = "learned positions, fused Conv1D QKV with biases, LayerNorm"
    tiny = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256, layer_norm_epsilon=1e-5,
                bos_token_id=1, eos_token_id=2)
    gguf_arch = "gpt2"
    fuzz_space = {"knobs": ("heads_hidden",)}
    layers_path = "transformer.h"
    size_keys = {"hidden": "n_embd", "heads": "n_head", "layers": "n_layer"}
    # the sum of the token and position embeddings: layer 0's input in both references
    hf_model_points = {"embeddings": ("transformer.drop", "out"), "final_norm": ("transformer.ln_f", "out")}
    lc_model_points = {**LcCapture.lc_model_points, "embeddings": LcPoint("inpL")}
    _conv1d = True  # HF stores c_attn / c_proj / c_fc as Conv1D [in, out]
    _converter_transposes = True  # GPT2Model.modify_tensors transposes them; a test switches it off
    _qkv = Point("attn.c_attn", "out")
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("ln_1", "out"),
        "q": _qkv, "k": _qkv, "v": _qkv,
        "attn_branch": Point("attn.c_proj", "in"),
        "attn_out": Point("attn.c_proj", "out"),
        "resid_mid": Point("ln_2", "in"),
        "layer_out": Point("", "out"),
    }
    lc_points = FUSED_QKV_NOPE_LC_POINTS  # views of wqkv + wqkv_b (build_qkv), no RoPE
    switch_modules = {"input_norm": ("ln_1",)}
    switch_params = {"qkv_bias": ("c_attn.bias",), "o_bias": ("attn.c_proj.bias",)}

    def _hidden(self, config) -> int:
        return config.n_embd

    def _kv_heads(self, config) -> int:
        return config.n_head

    def lc_layer_input(self, config, i: int):
        if i == 0:
            return "embeddings", self.lc_model_points["embeddings"]
        return super().lc_layer_input(config, i)

    def layer_config(self, config, i: int) -> LayerConfig:
        h, nh = self._hidden(config), config.n_head
        d = h // nh
        scale = None
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            # GPT2Attention.__init__: scaling /= float(layer_idx + 1)
            scale = d ** -0.5 / float(i + 1)
        if not getattr(config, "scale_attn_weights", True):
            scale = 1.0 if scale is None else scale * d ** 0.5
        return LayerConfig(hidden_size=h, n_heads=nh, n_kv_heads=self._kv_heads(config), head_dim=d,
                           input_norm=NormSpec("layer", config.layer_norm_epsilon), rope=None, scale=scale)

    def _weight(self, layer, name: str) -> np.ndarray | None:
        t = tensor(layer, name)
        return t.T if t is not None and self._conv1d and ("." + name).endswith(_CONV1D) else t

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        h, nh = self._hidden(config), config.n_head
        kv = self._kv_heads(config) * (h // nh)
        w = self._weight(layer, "attn.c_attn.weight")  # rows [Q; K; V] (c_attn(x).split)
        b = tensor(layer, "attn.c_attn.bias")
        return {"attn_norm": tensor(layer, "ln_1.weight"), "attn_norm_b": tensor(layer, "ln_1.bias"),
                "wq": w[:h], "wk": w[h:h + kv], "wv": w[h + kv:], "bq": b[:h], "bk": b[h:h + kv], "bv": b[h + kv:],
                "wo": self._weight(layer, "attn.c_proj.weight"), "bo": tensor(layer, "attn.c_proj.bias")}

    def hf_canonical(self, probe, arr, lc):
        if probe in ("q", "k", "v") and arr.ndim == 3:
            h, kv = lc.n_heads * lc.head_dim, lc.n_kv_heads * lc.head_dim
            lo, hi = {"q": (0, h), "k": (h, h + kv), "v": (h + kv, h + 2 * kv)}[probe]
            return arr[..., lo:hi].reshape(*arr.shape[:2], -1, lc.head_dim)
        return super().hf_canonical(probe, arr, lc)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/gpt2.py GPT2Model.set_gguf_parameters (no TextModel super call)
        w.add_block_count(config.n_layer)
        w.add_context_length(config.n_positions)  # hparams["n_ctx"]: transformers 5 saves n_positions
        w.add_embedding_length(config.n_embd)
        w.add_feed_forward_length(4 * config.n_embd)
        w.add_head_count(config.n_head)
        w.add_layer_norm_eps(config.layer_norm_epsilon)

    def gguf_transform(self, name, data, config):
        if self._conv1d and self._converter_transposes and name.endswith(_CONV1D):
            return np.ascontiguousarray(data.T)  # GPT2Model.modify_tensors: transpose(1, 0)
        return data

    def config_from_gguf(self, meta, shapes, tensors):
        """gpt2.cpp load_arch_hparams: the LayerNorm eps; MHA, a 4x FFN and the
        position table's length (the file's context)."""
        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        if hp.head_kv != hp.head:
            meta.refuse("attention.head_count_kv", hp.head_kv, f"KV groups; HF GPT2's c_attn is multi-head ({hp.head})")
        d = hp.n_embd // hp.head
        if hp.n_embd_head_k != d:
            meta.refuse("attention.key_length", hp.n_embd_head_k, f"HF GPT2 fixes head_dim = n_embd / n_head = {d}")
        vocab = vocab_of(meta, shapes)
        # llama.cpp sizes ffn_up / ffn_down from feed_forward_length (gpt2.cpp reads the
        # tensors as the file has them); HF GPT2MLP: inner_dim = n_inner or 4 * n_embd --
        # a width the converter never writes (it hard-codes 4 * n_embd) is still HF's n_inner
        # (llama.cpp's random-model generator writes 384 at n_embd 256)
        inner = {} if hp.ff == 4 * hp.n_embd else {"n_inner": hp.ff}
        return {**inner, "vocab_size": vocab, "n_embd": hp.n_embd, "n_layer": hp.n_layer, "n_head": hp.head,
                "n_positions": hp.n_ctx_train, "layer_norm_epsilon": meta.get_f32("attention.layer_norm_epsilon"),
                "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}


FAMILY = GPT2()
