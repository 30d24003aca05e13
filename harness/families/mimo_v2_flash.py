"""mimo_v2_flash: value scale, V width != K width, per-layer KV heads, sinks on
the sliding layers (HF ``MiMoV2FlashForCausalLM``; llama.cpp
``src/models/mimo2.cpp``, converter ``conversion/mimo.py`` ``MimoV2Model``).

``MiMoV2FlashAttention`` (modeling_mimo_v2_flash.py):
- V heads ``v_head_dim`` wide, Q/K heads ``head_dim`` wide; the softmax scale
  is ``head_dim ** -0.5`` and ``o_proj`` reads ``n_heads * v_head_dim``;
- a sliding-attention layer has twice ``num_key_value_heads`` KV heads, learned
  sinks (``self.sinks``, one logit per head, in the softmax denominator only)
  and the window ``config.sliding_window`` (keys with ``q - k < window``:
  ``sliding_window_overlay``); full-attention layers have neither;
- RoPE per layer type (``rope_parameters[layer_type]``: theta and a partial
  rotary factor), neox;
- the value scale ``attention_value_scale``.

Where the value scale sits: HF multiplies V by it before the attention
(``v_proj(x).view(...).transpose(1, 2) * self.v_scale``); llama.cpp multiplies
the branch after ``wo`` (mimo2.cpp: ``ggml_scale(attn_out, v_scale)``, named
``attn_out_scaled``); the spec (``project_attn_rows``, mimo2.cpp) and impl put
it after ``wo``. Both are the same number -- the attention is linear in V and
``o_proj`` has no bias -- but the intermediate tensors are not: HF's eager
attention output and ``o_proj`` input carry the factor. ``hf_canonical``
divides those two (``attn_heads``, ``attn_branch``) by the value scale, so every
probe means what the probe vocabulary says (``attn_branch`` = what enters
``wo`` in the spec's dataflow); HF's ``v`` (the ``v_proj`` output) is unscaled
already, and its ``attn_out`` (``o_proj`` output) is the scaled branch.

Tiny config: 4 layers ``[full, sliding, sliding, full]``, hidden 64, 4 heads
of 16 (V 8), 2 KV heads on full layers and 4 on sliding ones, window 5 (so it
acts at 16 tokens), rotary on 8 of 16 channels with theta 1e6 (full) / 1e4
(sliding), value scale 0.707 (HF's default), 4 routed experts (2 used) after a
dense first layer.

HF-only setting: ``attention_bias=True`` gives q/k/v biases that HF adds and
llama.cpp loads but never applies (mimo2.cpp's split path:
``build_lora_mm(wq, cur)`` with no ``wq_b``). The default config has none; the
second config ``--set attention_bias=true`` is exercised against HF and its
measured llama.cpp disagreement is a ``[[finding]]``.
"""

from __future__ import annotations

import numpy as np

from impl import LayerConfig, NormSpec, WindowSpec

from .base import LcPoint, LlamaLike, rope_from_config, tensor


def _torch():
    return __import__("torch")


class MiMoV2Flash(LlamaLike):
    name = "mimo_v2_flash"
    hf_model_type = "mimo_v2_flash"
    description = "value scale after wo, V width != K width, per-layer KV heads, sinks + window on sliding layers"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, v_head_dim=8, sliding_window=5,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        max_position_embeddings=256, rms_norm_eps=1e-5, attention_value_scale=0.707,
        bos_token_id=None, tie_word_embeddings=False,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        },
    )
    gguf_arch = "mimo2"
    extra_settable = ()
    weight_map = {**LlamaLike.weight_map, "self_attn.sinks": "sinks"}

    def build_model(self, config, seed: int, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM

        # experts_implementation="eager": the experts' own forward loop from the modeling
        # file; the default grouped_mm kernel refuses float64 (HF at --dtype float64)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                 experts_implementation="eager", dtype=torch.float32)
        self.init_weights(model, seed)
        return model.to(dtype=getattr(torch, dtype)).eval()

    @staticmethod
    def is_swa(config, i: int) -> bool:
        return config.layer_types[i] == "sliding_attention"

    @staticmethod
    def value_scale(config) -> float | None:
        # MiMoV2FlashAttention: v_scale = attention_value_scale, 1.0 when None
        vs = config.attention_value_scale
        return None if vs is None or vs == 1.0 else float(vs)

    def layer_config(self, config, i: int) -> LayerConfig:
        swa = self.is_swa(config, i)
        hd = config.head_dim
        return LayerConfig(
            hidden_size=config.hidden_size,
            n_heads=config.num_attention_heads,
            # MiMoV2FlashAttention.__init__: num_key_value_heads * 2 on sliding layers
            n_kv_heads=config.num_key_value_heads * (2 if swa else 1),
            head_dim=hd,
            v_head_dim=config.v_head_dim,
            input_norm=NormSpec("rms", config.rms_norm_eps),
            # position_embeddings[layer_type]: theta and partial factor of the layer's type
            rope=rope_from_config(config, config.layer_types[i], head_dim=hd),
            window=WindowSpec("sliding", int(config.sliding_window)) if swa else None,
            value_scale=self.value_scale(config),
        )

    def layer_weights(self, model, config, i):
        w = super().layer_weights(model, config, i)
        sinks = tensor(self.decoder_layers(model)[i], "self_attn.sinks")
        if sinks is not None:
            w["sinks"] = sinks
        return w

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        if "value_scale" in features:  # MiMoV2FlashAttention: v_scale 1.0 when None
            sw["value_scale"] = {"attention_value_scale": None}
        if "v_head_dim" in features:  # v_proj / o_proj sized from v_head_dim
            sw["v_head_dim"] = {"v_head_dim": config.head_dim}
        return sw

    # ------------------------------------------------------------------ probes
    def hf_canonical(self, probe, arr, lc):
        arr = super().hf_canonical(probe, arr, lc)
        if probe in ("attn_heads", "attn_branch") and isinstance(lc, LayerConfig) and lc.value_scale is not None:
            # HF scaled V before the attention; the canonical (spec, impl, llama.cpp)
            # tensors are unscaled until after wo. Exact by linearity: o_proj has no bias.
            return arr / lc.value_scale
        return arr

    def lc_points_for(self, config, i: int):
        # mimo2.cpp, split path: Qcur/Kcur/Vcur (MUL_MAT, reshape, ROPE for Q/K);
        # build_attn with wo: `kqv_out` (unscaled V) enters wo, the product is
        # `attn_out`; the value scale then gives `attn_out_scaled`, what the
        # residual add (`ffn_inp`) takes.
        pts = dict(self.lc_points)
        # Q and K are named on the projection (rows) and on the ROPE; the reshape
        # between them is not
        pts["q"] = LcPoint("Qcur", "pre_rope", "rows")
        pts["k"] = LcPoint("Kcur", "pre_rope", "rows")
        pts["resid_mid"] = LcPoint("ffn_inp")
        pts["attn_out"] = LcPoint("attn_out_scaled" if self.value_scale(config) is not None else "attn_out")
        return pts

    def lc_canonical(self, probe, arr, lc, config):
        if probe in ("q", "k") and arr.ndim == 3:
            heads = lc.n_heads if probe == "q" else lc.n_kv_heads
            return arr.reshape(*arr.shape[:2], heads, lc.head_dim)
        return super().lc_canonical(probe, arr, lc, config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/base.py TextModel.set_gguf_parameters, then MimoV2Model's
        (conversion/mimo.py), for the hub config equivalent to this HF config
        (``swa_num_key_value_heads = 2 * num_key_value_heads``, ``hybrid_layer_pattern``
        from ``layer_types``, the per-type rope parameters), without MTP
        (``--no-mtp``: ``_n_nextn = 0``). Keys the two write twice (head_count_kv,
        value_length, the rms eps) are written once, with the value that wins."""
        rp = config.rope_parameters
        hybrid = [1 if self.is_swa(config, i) else 0 for i in range(config.num_hidden_layers)]
        w.add_block_count(config.num_hidden_layers)
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        # MimoV2Model: per-layer KV heads (swa_num_key_value_heads on sliding layers)
        w.add_head_count_kv([config.num_key_value_heads * (2 if s else 1) for s in hybrid])
        # base: rope_parameters["full_attention"] theta, ["sliding_attention"] theta as freq_base_swa;
        # rope_type "default" writes no scaling
        w.add_rope_freq_base(rp["full_attention"]["rope_theta"])
        w.add_rope_freq_base_swa(rp["sliding_attention"]["rope_theta"])
        w.add_expert_count(config.n_routed_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_group_count(config.n_group)
        w.add_expert_group_used_count(config.topk_group)
        w.add_key_length(config.head_dim)
        w.add_value_length(config.v_head_dim)
        w.add_sliding_window(int(config.sliding_window))
        w.add_sliding_window_pattern(hybrid)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        # int(head_dim * partial_rotary_factor): one n_rot for both layer types
        w.add_rope_dimension_count(int(config.head_dim * rp["full_attention"]["partial_rotary_factor"]))
        # hparams.get("layernorm_epsilon", 1e-5): the converter overwrites rms_norm_eps
        w.add_layer_norm_rms_eps(getattr(config, "layernorm_epsilon", 1e-5))
        if config.attention_value_scale is not None:
            # gguf_writer.add_attn_value_scale (the installed gguf lacks the helper)
            w.add_float32(f"{w.arch}.attention.value_scale", float(config.attention_value_scale))

    def gguf_tensors(self, model, config, variant=None):
        import gguf

        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[self.gguf_arch]
        tmap = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
        for name, p in model.state_dict().items():
            data = p.detach().to(dtype=_torch().float32).cpu().numpy()
            for new_name, out in self._convert(name, data):
                gname = tmap.get_name(new_name, try_suffixes=(".weight", ".bias"))
                if gname is None:
                    raise ValueError(f"{self.name}: no GGUF name for HF tensor {new_name!r}")
                yield gname, out

    @staticmethod
    def _convert(name, data):
        if name.endswith("self_attn.sinks"):
            # HF save_pretrained writes the hub name `attention_sink_bias`; the converter's
            # filter_tensors appends `.weight` -> blk.N.attn_sinks.weight
            yield name.replace("self_attn.sinks", "self_attn.attention_sink_bias.weight"), data
            return
        if name.endswith("e_score_correction_bias"):
            # ModelBase.filter_tensors: -> e_score_correction.bias -> blk.N.exp_probs_b.bias
            yield name.replace("e_score_correction_bias", "e_score_correction.bias"), data
            return
        if name.endswith("mlp.experts.gate_up_proj"):
            # the hub stores experts one by one (mlp.experts.{e}.{gate,up}_proj) and the
            # converter stacks them: the same [E, F, H] halves of HF's fused tensor
            f = data.shape[-2] // 2
            base = name.removesuffix(".gate_up_proj")
            yield base + ".gate_proj.weight", np.ascontiguousarray(data[..., :f, :])
            yield base + ".up_proj.weight", np.ascontiguousarray(data[..., f:, :])
            return
        if name.endswith("mlp.experts.down_proj"):
            yield name + ".weight", data
            return
        yield name, data


FAMILY = MiMoV2Flash()
