"""gpt_bigcode (SantaCoder / StarCoder 1): gpt2's block with multi-query attention
and ``nn.Linear`` projections (HF ``GPTBigCodeForCausalLM``; llama.cpp
``src/models/starcoder.cpp``, converter ``conversion/starcoder.py``
``StarCoderModel``). What it shares with gpt2 is gpt2's (``harness/families/gpt2``);
what differs:

HF (``modeling_gpt_bigcode.py``):
- ``GPTBigCodeAttention.__init__``: ``kv_heads = 1 if multi_query else n_head``
  (``multi_query`` default True); ``c_attn`` an ``nn.Linear`` (``[out, in]``, no
  transpose) of ``n_embd + 2 * kv_dim`` rows.
- ``forward``: multi-query -- ``split((n_embd, kv_dim, kv_dim))``, rows ``[Q | K |
  V]``; multi-head -- ``view(..., n_head, 3 * head_dim).split(head_dim)``, per-head
  ``[q | k | v]`` (bloom's layout).
- ``activation_function`` "gelu_pytorch_tanh".

llama.cpp (``starcoder.cpp``): gpt2's graph (``inpL`` = tokens + positions,
``wqkv`` + ``wqkv_b``, ``wo_b``, ``ffn_inp``), GQA from ``head_count_kv``.

Converter (``StarCoderModel``): ``head_count_kv`` hard-coded 1, no tensor
reorder: a multi-head checkpoint (``multi_query=False``) is a file llama.cpp
refuses (``wqkv`` is ``3 * n_embd`` wide, not ``n_embd + 2 * head_dim``);
``feed_forward_length = 4 * n_embd``.
"""

from __future__ import annotations

import numpy as np

from .._convert import per_head_qkv_split
from ..base import tensor
from ..gpt2 import GPT2
from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of


class GPTBigCode(GPT2):
    name = "gpt_bigcode"
    hf_model_type = "gpt_bigcode"
    description = "gpt2's block with multi-query attention (SantaCoder / StarCoder 1)"
    tiny = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256, layer_norm_epsilon=1e-5,
                bos_token_id=1, eos_token_id=2)
    gguf_arch = "starcoder"
    _conv1d = False  # GPTBigCodeAttention / MLP: nn.Linear

    def _kv_heads(self, config) -> int:
        return 1 if config.multi_query else config.n_head  # GPTBigCodeAttention.kv_heads

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        w = super().layer_weights(model, config, i)
        if not config.multi_query:
            # GPTBigCodeAttention.forward: view(..., n_head, 3 * head_dim).split(head_dim)
            layer = self.decoder_layers(model)[i]
            nh = config.n_head
            w["wq"], w["wk"], w["wv"] = per_head_qkv_split(tensor(layer, "attn.c_attn.weight"), nh)
            w["bq"], w["bk"], w["bv"] = per_head_qkv_split(tensor(layer, "attn.c_attn.bias"), nh)
        return w

    def hf_canonical(self, probe, arr, lc):
        if probe in ("q", "k", "v") and arr.ndim == 3 and lc.n_kv_heads == lc.n_heads:
            j = {"q": 0, "k": 1, "v": 2}[probe]
            return arr.reshape(*arr.shape[:2], lc.n_heads, 3, lc.head_dim)[:, :, :, j, :]
        return super().hf_canonical(probe, arr, lc)

    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/starcoder.py StarCoderModel.set_gguf_parameters (no TextModel super call)
        w.add_context_length(config.n_positions)
        w.add_embedding_length(config.n_embd)
        w.add_feed_forward_length(4 * config.n_embd)
        w.add_block_count(config.n_layer)
        w.add_head_count(config.n_head)
        w.add_head_count_kv(1)  # hard-coded
        w.add_layer_norm_eps(config.layer_norm_epsilon)

    def config_from_gguf(self, meta, shapes, tensors):
        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        if hp.head_kv != 1:
            meta.refuse("attention.head_count_kv", hp.head_kv, "HF GPTBigCode's multi-query attention has one KV "
                                                            "head (the converter writes 1)")
        vocab = vocab_of(meta, shapes)
        # GPTBigCodeMLP: inner_dim = n_inner or 4 * n_embd (as gpt2's reverse)
        inner = {} if hp.ff == 4 * hp.n_embd else {"n_inner": hp.ff}
        return {**inner, "vocab_size": vocab, "n_embd": hp.n_embd, "n_layer": hp.n_layer, "n_head": hp.head,
                "n_positions": hp.n_ctx_train, "layer_norm_epsilon": meta.get_f32("attention.layer_norm_epsilon"),
                "multi_query": True, "tie_word_embeddings": "output.weight" not in shapes,
                **special_tokens(meta, vocab)}


FAMILY = GPTBigCode()
