"""cohere2: a parallel attention/FFN block, a bias-free LayerNorm, interleaved
RoPE on the sliding layers only -- the full layers are NoPE -- and a logit
scale (HF ``Cohere2ForCausalLM``; llama.cpp ``src/models/cohere2.cpp``).

HF (``modeling_cohere2.py``):
- ``Cohere2DecoderLayer.forward``: ``h = input_layernorm(x)``; ``x + self_attn(h)
  + mlp(h)`` -- attention and FFN read the same normed input and are summed into
  the residual in one expression (so there is no residual-between tensor).
- ``Cohere2LayerNorm``: mean-centred, weight, NO bias, in float32.
- ``Cohere2Attention.forward``: ``if self.sliding_window is not None:
  apply_rotary_pos_emb`` -- RoPE on sliding layers only; the layout is
  interleaved pairs (``rotate_half`` on ``x[..., ::2]`` / ``x[..., 1::2]``,
  ``repeat_interleave`` of the frequencies).
- ``Cohere2Config.__post_init__``: ``head_dim = hidden // heads`` (forced);
  ``layer_types`` from the BC ``sliding_window_pattern`` (sliding iff
  ``(i + 1) % pattern``).
- ``Cohere2ForCausalLM.forward``: ``logits * logit_scale``.

llama.cpp (``cohere2.cpp``): ``LLM_NORM`` with no bias, ``LLAMA_ROPE_TYPE_NORM``
(interleaved, so no permutation), RoPE ``if (is_swa)``, the FFN on the same
``attn_norm`` output, ``l_out = ffn_out + inpL + attn_out``, ``output``
always ``token_embd`` (``TENSOR_DUPLICATED``), ``ggml_scale(logit_scale)``.

GGUF: the converter (``conversion/command_r.py`` ``Cohere2Model``) writes
``logit_scale``, ``sliding_window``, ``rope.dimension_count`` from
``rotary_pct`` (absent from HF 5's config: 1.0 here) and drops all-zero
biases; it does NOT write ``attention.sliding_window_pattern``, so llama.cpp
falls back to its default of 4 (``load_swa_pattern(ml, 4)``). We write the
pattern as the bool array ``load_swa_pattern`` reads (the Cohere2-MoE
converter in the same file writes it the same way), so any HF ``layer_types``
reach llama.cpp.

Default config: 4 layers, pattern 2 (sliding, full, sliding, full), window 4.
"""

from __future__ import annotations

import numpy as np

from .._gguf_import import hf_rope, llama_like_config, read_hparams, swa_pattern
from ..base import LlamaLike, lc_unrotated
from harness.lazy import lazy

gguf = lazy("gguf")


class Cohere2(LlamaLike):
    name = "cohere2"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta", "window")}
    hf_model_type = "cohere2"
    description = "parallel block, bias-free LayerNorm, interleaved RoPE on sliding layers (full layers NoPE)"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        layer_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        sliding_window=4, sliding_window_pattern=2, logit_scale=0.25,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "cohere2"
    _write_swa_pattern = True  # beyond the converter (module docstring); a test switches it off
    extra_settable = ("sliding_window_pattern",)  # Cohere2Config.__post_init__ BC kwarg

    # no resid_mid: residual + attn + mlp is one expression (parallel block)
    hf_points = {k: v for k, v in LlamaLike.hf_points.items() if k != "resid_mid"}
    # attn_out: build_attn's wo product carries no name in cohere2.cpp -> not exposed; no
    # resid_mid (parallel block)
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k not in ("attn_out", "resid_mid")}

    input_norm_kind = "layer"  # Cohere2LayerNorm: weight, no bias
    rope_layout = "interleaved"  # Cohere2Attention.forward: interleaved pairs

    def norm_eps(self, config) -> float:
        return config.layer_norm_eps

    def _is_sliding(self, config, i: int) -> bool:
        return config.layer_types[i] == "sliding_attention"

    def uses_rope(self, config, i: int) -> bool:
        # Cohere2Attention.forward: RoPE only where sliding_window is set
        return self._is_sliding(config, i)

    def layer_config(self, config, i: int):
        # Cohere2DecoderLayer: residual + attn(h) + mlp(h)
        return super().layer_config(config, i).replace(residual="parallel")

    def lc_points_for(self, config, i: int):
        if self.uses_rope(config, i):
            return self.lc_points
        # cohere2.cpp: no ggml_rope_ext on a NoPE (full) layer; Qcur/Kcur enter attention as reshaped
        return lc_unrotated(self.lc_points)

    def gguf_params(self, w, config, variant=None):
        super().gguf_params(w, config, variant)
        # conversion/base.py TextModel.set_gguf_parameters: layer_norm_eps
        w.add_layer_norm_eps(config.layer_norm_eps)
        # conversion/command_r.py Cohere2Model.set_gguf_parameters
        w.add_logit_scale(config.logit_scale)
        w.add_sliding_window(config.sliding_window)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        # not written by the converter (see the module docstring): the per-layer
        # is_swa array cohere2.cpp's load_swa_pattern reads with get_arr
        if self._write_swa_pattern:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    def lc_refusal(self, config) -> str | None:
        # a seeded attention bias is never all zero, and the converter drops only all-zero
        # biases: conversion/command_r.py Cohere2Model.modify_tensors (53-60; Cohere2MoeModel
        # 140-146) raises "Bias tensor ... is not zero" -- llama.cpp's cohere2 graphs hold none
        if getattr(config, "attention_bias", False):
            return ("attention_bias=true: the converter refuses a non-zero bias tensor (conversion/command_r.py "
                    "Cohere2Model.modify_tensors: 'Bias tensor ... is not zero'; llama.cpp's cohere2 graph has no "
                    "attention bias); valid for llama.cpp: attention_bias=false, or run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_transform(self, name, data, config):
        # (cohere2.cpp: output is always token_embd; a tied head is never exported)
        if name.endswith(".bias") and np.issubdtype(data.dtype, np.floating):
            # a check on VALUES (the traced import passes element indices: there the
            # bias is one more tensor the file may carry)
            # command_r.py Cohere2Model.modify_tensors: all-zero biases are dropped,
            # any other bias is refused
            if (data != 0).any():
                raise ValueError(f"cohere2: bias tensor {name!r} is not zero; the converter refuses it")
            return None
        return data

    def config_from_gguf(self, meta, shapes, tensors):
        """cohere2.cpp load_arch_hparams: ``load_swa_pattern(ml, 4)``,
        ``rope.freq_base_swa`` (default: the main base, with its scaling),
        the window, the logit scale, the LayerNorm eps -- all required but the
        base. Only the sliding layers rotate (cohere2.cpp ``if (is_swa)``), so
        HF's one theta is the sliding layers' base."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 4)
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa))
        kw.update(rope_parameters=hf_rope(meta, hp, theta=meta.get_f32("rope.freq_base_swa", hp.rope_freq_base)),
                  sliding_window=int(meta.get("attention.sliding_window")),
                  logit_scale=meta.get_f32("logit_scale"),
                  layer_norm_eps=meta.get_f32("attention.layer_norm_epsilon"),
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa],
                  tie_word_embeddings=True)  # cohere2.cpp: output is always token_embd
        return kw


FAMILY = Cohere2()
