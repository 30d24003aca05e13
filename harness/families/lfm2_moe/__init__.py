"""lfm2_moe: lfm2's short-conv / attention hybrid with a mixture of experts after
the first dense layers (HF ``Lfm2MoeForCausalLM``, modeling_lfm2_moe.py; llama.cpp
arch ``lfm2moe``, the same graph, src/models/lfm2.cpp; converter
conversion/lfm2.py ``LFM2MoeModel``).

The token mixers are lfm2's (``harness.families.lfm2``): the conv layers are
``RecurrentConfig`` kind ``short_conv``, the attention layers llama-shaped with
per-head QK norms. What differs is the FFN, which only the reference-vs-reference
rows see: layers from ``num_dense_layers`` on route by sigmoid with a per-expert
bias (``Lfm2MoeTopKRouter``: top-k of sigmoid + expert_bias, weights renormalised;
lfm2.cpp ``build_moe_ffn(..., LLM_FFN_SILU, true, ...)``, gating ``SIGMOID``), the
experts fused in HF (``gate_up_proj [E, 2F, H]``, gate rows first) and stacked
per role in the GGUF (the converter merges ``w1`` / ``w3`` / ``w2`` per expert).

Tiny config: lfm2's 3 layers ``[conv, attention, conv]``, the first dense, then 4
experts of 32 (2 used); tied embeddings (HF's default; gguf's lfm2moe tensor map
names no output head).
"""

from __future__ import annotations

import numpy as np

from ..lfm2 import Lfm2, PerLayerKv
from harness.lazy import lazy
from .._gguf_export import text_model_gguf_params
from .._gguf_import import experts, one_per_layer, read_hparams

gguf = lazy("gguf")


class _WithOutput:
    """A gguf TensorNameMap that also names HF's ``lm_head`` GGUF's ``output``."""
    def __init__(self, tmap):
        self._tmap = tmap

    def get_name(self, key, try_suffixes=()):
        got = self._tmap.get_name(key, try_suffixes=try_suffixes)
        if got is None:
            for suffix in ("", *try_suffixes):
                if key == "lm_head" + suffix:
                    return "output" + suffix
        return got

    def __getattr__(self, name):
        return getattr(self._tmap, name)


class Lfm2Moe(Lfm2):
    name = "lfm2_moe"
    hf_model_type = "lfm2_moe"
    description = "lfm2's short-conv / attention hybrid with sigmoid-routed experts after the first dense layer"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5,
        conv_L_cache=3, conv_bias=False, layer_types=["conv", "full_attention", "conv"], num_dense_layers=1,
        num_experts=4, num_experts_per_tok=2, use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        # tied, as HF's default: gguf's lfm2moe tensor map has no `output` (lm_head) entry, and
        # lfm2.cpp falls back to token_embd (TENSOR_DUPLICATED)
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "lfm2moe"
    experts_implementation = "eager"

    def gguf_tensor_map(self, config):
        """gguf's lfm2moe map plus ``output`` for an untied ``lm_head``: gguf-py's
        MODEL_TENSORS[LFM2MOE] lists no OUTPUT, but lfm2moe.cpp:29 reads
        ``output.weight`` (TENSOR_NOT_REQUIRED) and llama.cpp's random-model generator
        writes it."""
        return _WithOutput(super().gguf_tensor_map(config))

    def gguf_params(self, w, config, variant=None):
        """conversion/lfm2.py ``LFM2MoeModel.set_gguf_parameters``: the per-layer KV heads
        (0 for a conv layer), TextModel's keys, the experts' width, the dense lead, the
        sigmoid gating, the vocabulary and ``shortconv.l_cache``."""

        text_model_gguf_params(w, PerLayerKv(config))
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_leading_dense_block_count(config.num_dense_layers)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_vocab_size(config.vocab_size)
        w.add_shortconv_l_cache(config.conv_L_cache)

    def gguf_convert(self, name, data, config, variant=None):
        """LFM2MoeModel.modify_tensors / filter_tensors on transformers 5's in-memory
        names: the conv squeezed; ``expert_bias`` -> ``expert_bias.bias``; the fused
        experts split per role (HF ``gate, up = linear(x, gate_up_proj[e]).chunk(2)``)
        and stacked as the converter merges ``w1`` / ``w3`` / ``w2``."""
        if "conv.conv" in name:
            yield name, data.squeeze(1)
            return
        if name.endswith(".feed_forward.expert_bias"):
            yield name + ".bias", data
            return
        if name.endswith("feed_forward.experts.gate_up_proj"):
            f = data.shape[-2] // 2
            base = name.removesuffix(".gate_up_proj")
            yield base + ".gate_proj.weight", np.ascontiguousarray(data[..., :f, :])
            yield base + ".up_proj.weight", np.ascontiguousarray(data[..., f:, :])
            return
        if name.endswith("feed_forward.experts.down_proj"):
            yield name + ".weight", data
            return
        yield name, data

    def config_from_gguf(self, meta, shapes, tensors):
        """lfm2.cpp load_arch_hparams for lfm2moe: lfm2's keys plus the experts' width,
        the dense lead and the gating function (sigmoid: HF's router)."""

        hp = read_hparams(meta)
        kw = self._hybrid_gguf_config(meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        if int(meta.get("expert_gating_func")) != 2:
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF Lfm2Moe routes by sigmoid (2)")
        kw.update(num_experts=n_exp, num_experts_per_tok=n_used, use_expert_bias=True, norm_topk_prob=True,
                  routed_scaling_factor=1.0, num_dense_layers=int(meta.get("leading_dense_block_count")),
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer))
        return kw


FAMILY = Lfm2Moe()
