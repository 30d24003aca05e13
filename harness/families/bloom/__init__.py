"""bloom: ALiBi instead of RoPE, LayerNorm with biases, a fused per-head
interleaved QKV (HF ``BloomForCausalLM``; llama.cpp ``src/models/bloom.cpp``).

HF ``BloomAttention.forward``: ``fused_qkv = query_key_value(x)`` (with bias),
split by ``_reshape`` as ``view(B, S, n_head, 3, head_dim)`` -- the columns
run ``[h0: q k v][h1: q k v]...`` -- then ``scores = alibi + q.k^T /
sqrt(head_dim)`` (``alibi.baddbmm``), the causal mask, a float32 softmax, and
``dense`` (o_proj, with bias). The residual is added INSIDE the attention
module (``dropout_add``), so the attention module's own output is the
residual after attention, not the branch; the branch is ``dense``'s output.

ALiBi: HF ``_get_alibi_slopes`` (max bias fixed at 8, the odd powers of a
second base for head counts that are not a power of two) times the KEY INDEX
(``slopes[:, None, None] * arange(kv_length)``); llama.cpp fixes
``f_max_alibi_bias = 8`` (``load_arch_hparams``: "TODO: become GGUF KV
parameter"), puts ``-|p_q - p_k|`` in the mask and lets ``soft_max_ext`` add
``slope_h * mask`` (``ggml-cpu/ops.cpp``); impl adds ``slope_h * (p_k - p_q)``
(``impl.attention.attend``). The three differ by a constant per query row,
which the softmax removes, so probabilities agree; pre-softmax logits are not
a probe here. HF counts key indices, llama.cpp and impl positions: our
positions start at 0, so they coincide.

llama.cpp wants contiguous ``[Q; K; V]`` rows: the converter
(``conversion/bloom.py`` ``BloomModel.modify_tensors``) reorders
``query_key_value`` weight and bias from per-head interleaved to Q, then K,
then V -- mirrored in ``gguf_tensors``; llama.cpp then views Q, K and V out of
the fused ``wqkv_b`` (``llm_graph_context::build_qkv``). impl takes separate
``wq`` / ``wk`` / ``wv`` split out of the same fused weight.

There is no ``eager_attention_forward`` to wrap: the probes are read from the
modules themselves -- q, k, v (and q_rope / k_rope, the very tensors that
enter ``baddbmm``: views of ``query_key_value``'s output, with nothing in
between) from ``query_key_value``'s output, attention probabilities from the
attention module's second output, ``attn_heads`` / ``attn_branch`` from
``dense``'s input (the merged heads). llama.cpp names no tensor for ``wo``'s
output (``build_attn``'s tail is unnamed), so ``attn_out`` is not exposed
there. The layer-0 input is the embedding LayerNorm's output in both
(``word_embeddings_layernorm`` / ``inp_norm-0``), and that is what
``embeddings`` compares.

The default tiny config has 4 heads (a power of two); ``--set hidden_size=96
--set n_head=6`` exercises the non-power-of-two slopes (harness/families/bloom/test_bloom.py).
"""

from __future__ import annotations

import re
import contextlib

import numpy as np

from contract.layers import LayerConfig, NormSpec, ConfigError

from .._convert import per_head_qkv_to_blocks
from .._gguf_import import alibi_config, read_hparams
from ..base import FUSED_QKV_NOPE_LC_POINTS, Family, LcPoint, Point, tensor
from harness.references.hf.capture import _to_np

# HF _get_alibi_slopes: base 2 ** (-(2 ** -(log2(cp2) - 3))) = 2 ** (-8 / cp2), i.e. max bias 8
ALIBI_MAX_BIAS = 8.0


class Bloom(Family):
    name = "bloom"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads_hidden",)}
    hf_model_type = "bloom"
    description = "ALiBi, LayerNorm with biases, fused per-head interleaved QKV"
    tiny = dict(vocab_size=128, hidden_size=64, n_layer=2, n_head=4, layer_norm_epsilon=1e-5)
    gguf_arch = "bloom"
    eager_name = "-"  # BloomAttention computes inline (no eager function): hf_taps reads the probes
    _reorder_qkv = True  # what the converter does; a test switches it off to show the capture notices
    layers_path = "transformer.h"
    size_keys = {"hidden": "hidden_size", "heads": "n_head", "layers": "n_layer"}
    hf_model_points = {"embeddings": ("transformer.word_embeddings_layernorm", "out"),
                       "final_norm": ("transformer.ln_f", "out")}
    _qkv = Point("self_attention.query_key_value", "out")
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("input_layernorm", "out"),
        "q": _qkv, "k": _qkv, "v": _qkv, "q_rope": _qkv, "k_rope": _qkv,
        "attn_heads": Point("self_attention.dense", "in"),
        "attn_branch": Point("self_attention.dense", "in"),
        "attn_out": Point("self_attention.dense", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    lc_points = FUSED_QKV_NOPE_LC_POINTS  # views of the fused wqkv_b (build_qkv)
    # the embedding LayerNorm is cb'd with il = 0 (bloom.cpp: cb(inpL, "inp_norm", 0))
    lc_model_points = {
        "embeddings": LcPoint("inp_norm-0"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }

    def layer_config(self, config, i: int) -> LayerConfig:
        if config.apply_residual_connection_post_layernorm:
            # BloomBlock: the residual becomes the NORMED input; impl's residual is the
            # layer input (and llama.cpp's bloom.cpp always adds the un-normed input)
            raise ConfigError("apply_residual_connection_post_layernorm=True is not implemented in impl; valid: false")
        h, nh = config.hidden_size, config.n_head
        return LayerConfig(
            hidden_size=h, n_heads=nh, n_kv_heads=nh, head_dim=h // nh,
            input_norm=NormSpec("layer", config.layer_norm_epsilon),  # BloomBlock.input_layernorm
            rope=None,
            alibi_max_bias=ALIBI_MAX_BIAS,
            # BloomAttention.inv_norm_factor = 1 / sqrt(head_dim): the default scale
        )

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        h, nh = config.hidden_size, config.n_head
        d = h // nh
        # BloomAttention._reshape: output columns (head, [q, k, v], head_dim)
        w = tensor(layer, "self_attention.query_key_value.weight").reshape(nh, 3, d, h)
        b = tensor(layer, "self_attention.query_key_value.bias").reshape(nh, 3, d)
        return {
            "attn_norm": tensor(layer, "input_layernorm.weight"),
            "attn_norm_b": tensor(layer, "input_layernorm.bias"),
            "wq": w[:, 0].reshape(h, h), "wk": w[:, 1].reshape(h, h), "wv": w[:, 2].reshape(h, h),
            "bq": b[:, 0].reshape(h), "bk": b[:, 1].reshape(h), "bv": b[:, 2].reshape(h),
            "wo": tensor(layer, "self_attention.dense.weight"),
            "bo": tensor(layer, "self_attention.dense.bias"),
        }

    # ------------------------------------------------------------------ HF probes
    def hf_taps(self, model, config, sink: dict):
        """BloomAttention returns ``(residual + attn, attention_probs)``: the
        probabilities the forward itself used, read off its second output."""

        @contextlib.contextmanager
        def taps():
            handles = []
            for i, layer in enumerate(self.decoder_layers(model)):
                def post(mod, args, out, i=i):
                    sink.setdefault(i, {})["attn_probs"] = _to_np(out[1])
                handles.append(layer.self_attention.register_forward_hook(post))
            try:
                yield
            finally:
                for hd in handles:
                    hd.remove()

        return taps()

    def hf_canonical(self, probe: str, arr: np.ndarray, lc) -> np.ndarray:
        s, t = arr.shape[0], arr.shape[1] if arr.ndim > 1 else None
        if probe in ("q", "k", "v", "q_rope", "k_rope"):
            # BloomAttention._reshape: view(B, S, n_head, 3, head_dim)[..., j, :]
            j = {"q": 0, "q_rope": 0, "k": 1, "k_rope": 1, "v": 2}[probe]
            return arr.reshape(s, t, lc.n_heads, 3, lc.head_dim)[:, :, :, j, :]
        if probe == "attn_heads":  # _merge_heads: (B, S, n_head * head_dim)
            return arr.reshape(s, t, lc.n_heads, lc.dv)
        return arr

    # ------------------------------------------------------------------ llama.cpp
    def lc_layer_input(self, config, i: int):
        if i == 0:
            return "embeddings", self.lc_model_points["embeddings"]
        return super().lc_layer_input(config, i)

    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/bloom.py BloomModel.set_gguf_parameters (no TextModel super call)
        n_embed, n_head = config.hidden_size, config.n_head
        w.add_context_length(getattr(config, "seq_length", None) or n_embed)
        w.add_embedding_length(n_embed)
        w.add_feed_forward_length(4 * n_embed)
        w.add_block_count(config.n_layer)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head)
        w.add_layer_norm_eps(config.layer_norm_epsilon)

    def gguf_convert(self, name, data, config, variant=None):
        name = re.sub(r"transformer\.", "", name)  # BloomModel.modify_tensors
        if self._reorder_qkv and re.match(r"h\.\d+\.self_attention\.query_key_value\.(weight|bias)", name):
            # "Map bloom-style qkv_linear to gpt-style qkv_linear": (head, 3, d, h) -> [Q; K; V]
            data = per_head_qkv_to_blocks(data, config.n_head)
        yield name, np.ascontiguousarray(data)

    def config_from_gguf(self, meta, shapes, tensors):
        # bloom.cpp load_arch_hparams: layer_norm_eps; ALiBi's max bias is fixed at 8 (no
        # key); HF BloomMLP is 4 * hidden wide
        hp = read_hparams(meta)
        kw = alibi_config(self, meta, shapes, hp)
        if hp.ff != 4 * hp.n_embd:
            meta.refuse("feed_forward_length", hp.ff, f"HF BloomMLP is 4 * hidden_size = {4 * hp.n_embd} wide")
        kw.update(hidden_size=hp.n_embd, n_layer=hp.n_layer, n_head=hp.head,
                  layer_norm_epsilon=meta.get_f32("attention.layer_norm_epsilon"))
        return kw


FAMILY = Bloom()
