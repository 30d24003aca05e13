"""gpt_oss: attention sinks, o_proj bias, QKV biases, alternating sliding window,
YaRN (HF ``GptOssForCausalLM``, transformers/models/gpt_oss/modeling_gpt_oss.py;
llama.cpp ``src/models/openai-moe.cpp``, arch ``gpt-oss``).

The attention half (``GptOssAttention.forward`` + ``eager_attention_forward``):
RMS input norm (plain ``w``), q/k/v/o projections with biases
(``attention_bias`` defaults to True), neox RoPE with YaRN scaling -- the
attention factor ``0.1 ln(factor) + 1`` multiplies cos AND sin --, scale
``head_dim ** -0.5``, a learned per-head sink logit ``sinks[h]`` concatenated
as an extra softmax column and dropped after the softmax (unscaled, unmasked:
it joins the max and the denominator and contributes no value), even layers
sliding (``layer_types``: sliding if ``(i + 1) % 2``), ``o_proj`` with its bias
added to the residual, no post-attention norm. The FFN is a mixture of experts;
teacher forcing keeps the attention comparison exact whatever the FFN does.

llama.cpp: NEOX RoPE (no Q/K permutation); ``build_attn(..., wo, wo_b, ...,
sinks=attn_sinks, kq_scale=1/sqrt(n_rot))`` then ``cb(cur, "attn_out")`` (o_proj
incl. bias); ``ggml_soft_max_ext`` + ``ggml_soft_max_add_sinks`` give
``kq_soft_max`` without the sink column, like HF's returned weights; even
layers are SWA (``set_swa_pattern(2)``), the window rule ``p1 - p0 < n_swa``
equals HF's. ``attn_post_norm`` there is HF's ``post_attention_layernorm``
(the pre-MoE norm), not a branch norm, so it is not a probe here.

Configs:
- default: YaRN with ``truncate: True``, on which both references agree.
- HF-only: ``--set rope_parameters.truncate=false`` (HF gpt-oss's own default).
  HF keeps the YaRN correction range fractional (modeling_rope_utils.py
  ``_compute_yarn_parameters`` / ``find_correction_range``: floor/ceil only
  ``if truncate``); llama.cpp always floors and ceils
  (ggml.c ``ggml_rope_yarn_corr_dims``) and no GGUF key carries the flag. impl
  follows HF; the llama.cpp side is a ``[[finding]]`` (fixtures/tolerance.toml).
- HF-only: ``--set layer_types='["full_attention","sliding_attention"]'``. The
  converter writes no layer pattern and llama.cpp slides the even layers
  (``set_swa_pattern(2)``), so a swapped pattern is a ``[[finding]]``.
- HF-only: ``--set rope_parameters.attention_factor=1.1``. HF scales cos and
  sin by the configured factor; the converter writes
  ``rope.scaling.yarn_attn_factor`` but llama.cpp recomputes it for every YaRN
  model as ``0.1 ln(factor) + 1`` (src/llama-context.cpp): a ``[[finding]]``.
"""

from __future__ import annotations

import numpy as np

from .._gguf_import import experts, llama_like_config, one_per_layer, one_theta, read_hparams, swa_pattern
from ..base import LlamaLike, text_model_gguf_params

TRUNCATE_OFF = (("rope_parameters.truncate", False),)  # the HF-only configs, as overrides
ATTN_FACTOR = (("rope_parameters.attention_factor", 1.1),)
SWAPPED_LAYERS = (("layer_types", ["full_attention", "sliding_attention"]),)


class GptOss(LlamaLike):
    name = "gpt_oss"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "window", "yarn_params")}
    hf_model_type = "gpt_oss"
    description = "sinks, o_proj bias, QKV bias, alternating sliding window, YaRN; MoE FFN"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # config default head_dim is 64
        num_local_experts=4, num_experts_per_tok=2,
        sliding_window=4,  # layer 0 reads 4 keys at 16 tokens; layer 1 is full
        max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,  # llama.cpp needs output.weight
        # HF's own default rope_parameters, with truncate=True (see the module docstring)
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": True, "original_max_position_embeddings": 4096},
    )
    gguf_arch = "gpt-oss"
    # GptOssAttention.sinks: nn.Parameter([num_attention_heads]); the tensor decides (spec)
    weight_map = {**LlamaLike.weight_map, "self_attn.sinks": "sinks"}
    # GptOssExperts.forward itself, the loop the modeling file spells out; the default
    # grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def init_value(self, name, p, r):
        # GptOssExperts computes x @ W: the fan-in of gate_up_proj [E, H, 2I] and
        # down_proj [E, I, H] is the middle axis, not the last
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            return r / np.sqrt(p.shape[-2])
        return super().init_value(name, p, r)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/gpt_oss.py GptOssModel.set_gguf_parameters: TextModel's, then
        # sliding_window and expert_feed_forward_length (both required by
        # openai-moe.cpp load_arch_hparams). `layer_types` and YaRN `truncate` are
        # not written; llama.cpp derives even-layer SWA from set_swa_pattern(2).
        text_model_gguf_params(w, config)
        w.add_sliding_window(config.sliding_window)
        w.add_expert_feed_forward_length(config.intermediate_size)

    def gguf_convert(self, name, data, config, variant=None):
        if "sinks" in name:  # GptOssModel.filter_tensors: `name += ".weight"`
            name += ".weight"
        outs = [(name, data)]
        # GptOssModel.modify_tensors, the non-MXFP4 arm:
        if name.endswith("down_proj_bias"):
            outs = [(name.replace("down_proj_bias", "down_proj.bias"), data)]
        elif name.endswith("down_proj"):  # [E, I, H] -> [E, H, I]
            outs = [(name.replace("down_proj", "down_proj.weight"), data.transpose(0, 2, 1))]
        elif name.endswith("gate_up_proj_bias"):  # gate / up interleaved on the last axis
            outs = [(name.replace("gate_up_proj_bias", "gate_proj.bias"), data[..., ::2]),
                    (name.replace("gate_up_proj_bias", "up_proj.bias"), data[..., 1::2])]
        elif name.endswith("gate_up_proj"):  # [E, H, 2I] -> [E, 2I, H], then split rows
            t = data.transpose(0, 2, 1)
            outs = [(name.replace("gate_up_proj", "gate_proj.weight"), t[:, ::2, :]),
                    (name.replace("gate_up_proj", "up_proj.weight"), t[:, 1::2, :])]
        for n, d in outs:
            yield n, np.ascontiguousarray(d)


    def config_from_gguf(self, meta, shapes, tensors):
        """openai-moe.cpp load_arch_hparams: the RMS eps, the experts' width
        (required), the window (required) with ``load_swa_pattern(ml, 2)``, and
        ``rope.freq_base_swa`` (default: the main base and scaling)."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 2)
        one_theta(meta, hp, swa)
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa), moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_local_experts=n_exp,
                  num_experts_per_tok=n_used, intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  sliding_window=int(meta.get("attention.sliding_window")),
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa])
        return kw


FAMILY = GptOss()
