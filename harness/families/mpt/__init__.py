"""mpt: ALiBi, a QKV clamp, LayerNorm without biases, a fused contiguous
``[Q; K; V]`` projection (HF ``MptForCausalLM``; llama.cpp ``src/models/mpt.cpp``).

HF ``MptAttention.forward``: ``mixed_qkv = Wqkv(x)`` (no bias), clamped to
``+-clip_qkv`` when set, ``chunk(3)`` into Q, K, V; ``scores = q.k^T *
softmax_scale + position_bias`` (``build_mpt_alibi_tensor``), the causal
mask, a float32 softmax, ``out_proj``. The block adds the residual
(``MptBlock.forward``).

ALiBi: HF ``build_mpt_alibi_tensor`` is always called with its default
``alibi_bias_max=8`` (``MptModel.forward``) -- HF ignores
``attn_config.alibi_bias_max`` and ``attn_config.alibi``. Its slopes for a
head count that is not a power of two (``concat(slopes[1::2],
slopes[::2])[:n]`` of the next power of two) equal llama.cpp's
(``ggml-cpu/ops.cpp`` soft_max: ``m0^(h+1)`` for the first ``2^floor(log2
n)`` heads, odd powers of ``m1`` after) and impl's
(``impl.config.alibi_slopes``) -- the default tiny config has 6 heads to
show it. HF's bias is ``slope * (k - (max_seq_len - 1))`` per key,
llama.cpp's ``-slope * |p_q - p_k|``, impl's ``slope * (p_k - p_q)``: equal up
to a constant per query row, which the softmax removes.

The converter (``conversion/mpt.py`` ``MPTModel``) writes
``max_alibi_bias = attn_config.alibi_bias_max`` (0 when ``alibi`` is off) and
llama.cpp reads it (no key: no ALiBi at all), so a config with
``alibi_bias_max != 8`` is an HF-only setting: HF keeps 8, llama.cpp takes the
written value (``[[finding]]`` in fixtures/tolerance.toml, exercised by
harness/families/mpt/test_mpt.py with ``--set attn_config.alibi_bias_max=4``). The
converter also hard-codes ``layer_norm_eps = 1e-5`` (the tiny config keeps
HF's default 1e-5), and registers only ``MPTForCausalLM`` (transformers
saves ``MptForCausalLM``); the export here mirrors its steps directly.

No ``eager_attention_forward`` exists to wrap, and no module outputs the
clamped Q, K, V: ``hf_taps`` records the two ``torch.matmul`` calls of
``MptAttention.forward`` (``q @ k^T``, then ``probs @ v``) -- the very
tensors HF multiplies, clamp included.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from contract.layers import LayerConfig, NormSpec

from .._gguf_import import alibi_config, read_hparams
from ..base import FUSED_QKV_NOPE_LC_POINTS, Family, Point, tensor
from harness.references.hf.capture import _to_np

# HF MptModel.forward: build_mpt_alibi_tensor(num_heads, max_seq_len) -- default alibi_bias_max
HF_ALIBI_MAX_BIAS = 8.0


class _MatmulTap:
    """Stands in for ``torch`` inside ``modeling_mpt`` while capturing: every
    attribute is torch's own, ``matmul`` also reports its operands and result."""

    def __init__(self, torch_mod, on_matmul):
        self._torch = torch_mod
        self._on = on_matmul

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def matmul(self, a, b, *args, **kwargs):
        out = self._torch.matmul(a, b, *args, **kwargs)
        self._on(a, b, out)
        return out


class Mpt(Family):
    name = "mpt"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ()}
    hf_model_type = "mpt"
    description = "ALiBi (6 heads: non-power-of-two slopes), QKV clamp, bias-free LayerNorm"
    tiny = dict(vocab_size=128, d_model=96, n_heads=6, n_layers=2, max_seq_len=64, layer_norm_epsilon=1e-5,
                attn_config={"clip_qkv": 1.5})
    gguf_arch = "mpt"
    eager_name = "-"  # MptAttention computes inline (no eager function): hf_taps reads the probes
    layers_path = "transformer.blocks"
    size_keys = {"hidden": "d_model", "heads": "n_heads", "layers": "n_layers"}
    # MptBlock: norm_1 before the attention (feature bisection's LayerNorm switch)
    switch_modules = {**Family.switch_modules, "input_norm": ("norm_1",)}
    hf_model_points = {"embeddings": ("transformer.wte", "out"), "final_norm": ("transformer.norm_f", "out")}
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("norm_1", "out"),
        "attn_branch": Point("attn.out_proj", "in"),
        "attn_out": Point("attn.out_proj", "out"),
        "resid_mid": Point("norm_2", "in"),
        "layer_out": Point("", "out"),
    }
    lc_points = FUSED_QKV_NOPE_LC_POINTS  # views of the (clamped) fused wqkv (build_qkv)

    def layer_config(self, config, i: int) -> LayerConfig:
        a = config.attn_config
        h, nh = config.d_model, config.n_heads
        return LayerConfig(
            hidden_size=h, n_heads=nh, n_kv_heads=nh, head_dim=h // nh,
            # MptBlock.norm_1: LayerNorm with its bias set to None
            input_norm=NormSpec("layer", config.layer_norm_epsilon),
            # MptAttention.forward: `if self.clip_qkv: mixed_qkv.clamp(...)`
            qkv_clamp=float(a.clip_qkv) if a.clip_qkv else None,
            scale=a.softmax_scale,  # None: 1 / sqrt(d_model / n_heads)
            rope=None,
            alibi_max_bias=HF_ALIBI_MAX_BIAS,
        )

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        h = config.d_model
        wqkv = tensor(layer, "attn.Wqkv.weight")  # mixed_qkv.chunk(3, dim=2): rows [Q; K; V]
        return {
            "attn_norm": tensor(layer, "norm_1.weight"),
            "wq": wqkv[:h], "wk": wqkv[h:2 * h], "wv": wqkv[2 * h:],
            "wo": tensor(layer, "attn.out_proj.weight"),
        }

    def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
        # HF honours clip_qkv (MptAttention.forward); it ignores attn_config.alibi and
        # alibi_bias_max, so ALiBi cannot be switched off in the reference
        sw = super().feature_switches(config, features)
        if "qkv_clamp" in features:
            sw["qkv_clamp"] = {"attn_config.clip_qkv": None}
        return sw

    # ------------------------------------------------------------------ HF probes
    def hf_taps(self, model, config, sink: dict):
        layers = self.decoder_layers(model)
        mod = sys.modules[type(layers[0].attn).__module__]
        state = {"layer": None, "call": 0}

        def on_matmul(a, b, out):
            i = state["layer"]
            if i is None:
                return
            rec = sink.setdefault(i, {})
            if state["call"] == 0:  # torch.matmul(query_states, key_states.transpose(-1, -2))
                rec["q"] = rec["q_rope"] = _to_np(a)
                rec["k"] = rec["k_rope"] = _to_np(b.transpose(-1, -2))
            elif state["call"] == 1:  # torch.matmul(attn_weights, value_states)
                rec["attn_probs"] = _to_np(a)
                rec["v"] = _to_np(b)
                rec["attn_heads"] = _to_np(out)
            state["call"] += 1

        @contextlib.contextmanager
        def taps():
            handles = []
            for i, layer in enumerate(layers):
                def enter(m, args, i=i):
                    state["layer"], state["call"] = i, 0

                def leave(m, args, out):
                    state["layer"] = None

                handles.append(layer.attn.register_forward_pre_hook(enter))
                handles.append(layer.attn.register_forward_hook(leave))
            real = mod.torch
            mod.torch = _MatmulTap(real, on_matmul)
            try:
                yield
            finally:
                mod.torch = real
                for hd in handles:
                    hd.remove()

        return taps()

    def hf_canonical(self, probe: str, arr: np.ndarray, lc) -> np.ndarray:
        if probe in ("q", "k", "v", "q_rope", "k_rope", "attn_heads"):
            return arr.transpose(0, 2, 1, 3)  # [B, heads, S, D] -> [B, S, heads, D]
        return arr

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/mpt.py MPTModel.set_gguf_parameters (no TextModel super call)
        a = config.attn_config
        w.add_context_length(config.max_seq_len)
        w.add_embedding_length(config.d_model)
        w.add_block_count(config.n_layers)
        w.add_feed_forward_length(4 * config.d_model)
        w.add_head_count(config.n_heads)
        if getattr(a, "kv_n_heads", None):
            w.add_head_count_kv(a.kv_n_heads)
        w.add_layer_norm_eps(1e-5)  # hard-coded by the converter
        if a.clip_qkv is not None:
            w.add_clamp_kqv(a.clip_qkv)
        w.add_max_alibi_bias(a.alibi_bias_max if a.alibi else 0.0)

    def config_from_gguf(self, meta, shapes, tensors):
        """mpt.cpp load_arch_hparams: layer_norm_eps, clamp_kqv (optional; > 0
        clamps), max_alibi_bias (optional; absent or 0: no ALiBi at all). HF's MPT
        always runs ALiBi with max bias 8 (``build_mpt_alibi_tensor``'s default):
        any other value is refused."""
        hp = read_hparams(meta)
        kw = alibi_config(self, meta, shapes, hp)
        alibi = meta.get_f32("attention.max_alibi_bias", 0.0)
        if alibi != HF_ALIBI_MAX_BIAS:
            meta.refuse("attention.max_alibi_bias", alibi, f"HF MPT always adds ALiBi with max bias {HF_ALIBI_MAX_BIAS:g}")
        clamp = meta.get_f32("attention.clamp_kqv", 0.0)
        kw.update(d_model=hp.n_embd, n_layers=hp.n_layer, n_heads=hp.head, max_seq_len=hp.n_ctx_train,
                  expansion_ratio=hp.ff // hp.n_embd, layer_norm_epsilon=meta.get_f32("attention.layer_norm_epsilon"),
                  no_bias="blk.0.attn_qkv.bias" not in shapes,
                  attn_config={"clip_qkv": clamp if clamp > 0 else None, "alibi": True, "alibi_bias_max": 8})
        return kw


FAMILY = Mpt()
