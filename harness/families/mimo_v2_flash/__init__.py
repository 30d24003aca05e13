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

from contract.layers import LayerConfig, WindowSpec

from .._gguf_import import experts, hf_rope, one_per_layer, read_hparams, special_tokens, vocab_of
from ..base import LcPoint, LlamaLike, gguf_moe_convert, gguf_size_params


class MiMoV2Flash(LlamaLike):
    name = "mimo_v2_flash"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "window")}
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
    experts_implementation = "eager"
    # position_embeddings[layer_type]: theta and partial factor of the layer's type
    rope_per_layer_type = True

    @staticmethod
    def _is_swa(config, i: int) -> bool:
        return config.layer_types[i] == "sliding_attention"

    @staticmethod
    def _value_scale(config) -> float | None:
        # MiMoV2FlashAttention: v_scale = attention_value_scale, 1.0 when None
        vs = config.attention_value_scale
        return None if vs is None or vs == 1.0 else float(vs)

    def window(self, config, i: int):
        return WindowSpec("sliding", int(config.sliding_window)) if self._is_swa(config, i) else None

    def layer_config(self, config, i: int) -> LayerConfig:
        return super().layer_config(config, i).replace(
            # MiMoV2FlashAttention.__init__: num_key_value_heads * 2 on sliding layers
            n_kv_heads=config.num_key_value_heads * (2 if self._is_swa(config, i) else 1),
            v_head_dim=config.v_head_dim,
            value_scale=self._value_scale(config),
        )

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
        pts["attn_out"] = LcPoint("attn_out_scaled" if self._value_scale(config) is not None else "attn_out")
        return pts

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/base.py TextModel.set_gguf_parameters, then MimoV2Model's
        (conversion/mimo.py), for the hub config equivalent to this HF config
        (``swa_num_key_value_heads = 2 * num_key_value_heads``, ``hybrid_layer_pattern``
        from ``layer_types``, the per-type rope parameters), without MTP
        (``--no-mtp``: ``_n_nextn = 0``). Keys the two write twice (head_count_kv,
        value_length, the rms eps) are written once, with the value that wins."""
        rp = config.rope_parameters
        hybrid = [1 if self._is_swa(config, i) else 0 for i in range(config.num_hidden_layers)]
        gguf_size_params(w, config, head_count_kv=False)
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

    def gguf_convert(self, name, data, config, variant=None):
        if name.endswith("self_attn.sinks"):
            # HF save_pretrained writes the hub name `attention_sink_bias`; the converter's
            # filter_tensors appends `.weight` -> blk.N.attn_sinks.weight
            yield name.replace("self_attn.sinks", "self_attn.attention_sink_bias.weight"), data
            return
        # the hub stores experts one by one (mlp.experts.{e}.{gate,up}_proj) and the
        # converter stacks them: the same [E, F, H] halves of HF's fused tensor
        yield from gguf_moe_convert(name, data) or [(name, data)]


    def config_from_gguf(self, meta, shapes, tensors):
        """mimo2.cpp load_arch_hparams: the RMS eps, the experts' width, the window
        and the per-layer ``sliding_window_pattern`` array (both required),
        ``rope.freq_base_swa`` (default 10000: llama_hparams; the sliding layers
        take no frequency scaling), the value scale (1 or absent: none). HF's
        sliding layers have twice the full layers' KV heads, and one rotary
        fraction for both kinds."""
        hp = read_hparams(meta)
        swa = meta.get("attention.sliding_window_pattern")
        if not isinstance(swa, (list, tuple)) or len(swa) != hp.n_layer:
            meta.refuse("attention.sliding_window_pattern", swa, f"mimo2.cpp reads an array of {hp.n_layer} flags")
        swa = [bool(s) for s in swa]
        kv = hp.n_head_kv[swa.index(False)] if False in swa else hp.n_head_kv[0] // 2
        if any(n != kv * (2 if s else 1) for n, s in zip(hp.n_head_kv, swa)):
            meta.refuse("attention.head_count_kv", hp.n_head_kv, "HF MiMoV2Flash has num_key_value_heads on full "
                                                                 "layers and twice that on sliding ones")
        hk, hv = hp.n_embd_head_k, hp.n_embd_head_v
        if (hp.n_embd_head_k_swa, hp.n_embd_head_v_swa, hp.n_rot_swa) != (hk, hv, hp.n_rot):
            meta.refuse("attention.key_length_swa", hp.n_embd_head_k_swa, "sliding layers with other head sizes")
        prf = hp.n_rot / hk
        n_exp, n_used = experts(meta, hp, self.name, groups=True)
        vocab = vocab_of(meta, shapes)
        value_scale = meta.get_f32("attention.value_scale", None)
        full = {**hf_rope(meta, hp), "partial_rotary_factor": prf}
        sliding = {"rope_type": "default", "rope_theta": meta.get_f32("rope.freq_base_swa", 10000.0),
                   "partial_rotary_factor": prf}
        return dict(
            num_hidden_layers=hp.n_layer, max_position_embeddings=hp.n_ctx_train, hidden_size=hp.n_embd,
            intermediate_size=hp.ff, num_attention_heads=hp.head, num_key_value_heads=kv, head_dim=hk,
            v_head_dim=hv, vocab_size=vocab, tie_word_embeddings="output.weight" not in shapes,
            rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
            sliding_window=int(meta.get("attention.sliding_window")),
            layer_types=["sliding_attention" if s else "full_attention" for s in swa],
            mlp_layer_types=["sparse" if f"blk.{i}.ffn_gate_inp.weight" in shapes else "dense"
                             for i in range(hp.n_layer)],
            n_routed_experts=n_exp, num_experts_per_tok=n_used, n_group=max(hp.n_expert_groups, 1),
            topk_group=max(hp.n_group_used, 1),
            moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
            attention_value_scale=None if value_scale in (None, 1.0) else value_scale,
            attention_bias="blk.0.attn_q.bias" in shapes,
            rope_parameters={"full_attention": full, "sliding_attention": sliding}, **special_tokens(meta, vocab))


FAMILY = MiMoV2Flash()
