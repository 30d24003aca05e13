"""granite: attention multiplier as the softmax scale, residual and embedding
multipliers (HF ``GraniteForCausalLM``, transformers/models/granite/modeling_granite.py;
llama.cpp ``src/models/granite.cpp``).

The attention half (``GraniteDecoderLayer.forward``): llama's shape (RMS input
norm, neox RoPE, optional q/k/v/o biases via ``attention_bias``), except
- the softmax scale IS ``attention_multiplier`` (``GraniteAttention.__init__``:
  ``self.scaling = config.attention_multiplier``; it replaces ``head_dim**-0.5``,
  and HF's default of 1.0 is not ``1/sqrt(d)``);
- the residual adds the branch times ``residual_multiplier``
  (``hidden_states = residual + hidden_states * self._residual_multiplier``);
- the embedding is multiplied by ``embedding_multiplier`` in
  ``GraniteModel.forward``, outside ``embed_tokens``; the logits are divided by
  ``logits_scaling``.

Probe map: ``attn_out`` is the ``self_attn`` output, BEFORE the residual
multiplier (llama.cpp ``attn_out``, granite.cpp ``build_layer_ffn`` scales it
unnamed before ``ffn_inp``); ``resid_mid`` includes it. The model-level
``embeddings`` probe is the SCALED embedding, the first layer's input: that is
what llama.cpp's ``embd`` holds (``build_inp_embd`` applies
``f_embedding_scale`` before ``cb(cur, "embd")``), and HF's ``embed_tokens``
output is unscaled; so the embedding multiplier is compared there.

llama.cpp runs granite with LLAMA_ROPE_TYPE_NORM, so the converter
(conversion/granite.py ``GraniteModel(LlamaModel)``) permutes the Q/K rows and
biases per head like llama's; the capture undoes it. Metadata: LlamaModel's
(TextModel + vocab_size + rope.dimension_count, after popping head_dim), then
``attention.scale`` / ``embedding_scale`` / ``residual_scale`` / ``logit_scale``,
each only when truthy. Both references agree on the default tiny config
(multipliers 0.15 / 12 / 0.22 / 8, biases on).
"""

from __future__ import annotations

from contract.layers import LayerConfig

from ..base import LlamaLike, text_model_gguf_params
from ..llama import PermutedQK


class Granite(PermutedQK):
    name = "granite"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta")}
    hf_model_type = "granite"
    description = "attention multiplier as scale, residual and embedding multipliers, QKV+o bias"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_multiplier=0.15,  # the scale itself, deliberately != 16 ** -0.5
        embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
        attention_bias=True,  # q/k/v/o biases (exercises the converter's bias permutation)
        tie_word_embeddings=False,
    )
    gguf_arch = "granite"
    extra_settable = ()  # GraniteConfig has no head_dim; the converter pops it anyway
    # GraniteModel.forward: inputs_embeds = embed_tokens(ids) * embedding_multiplier,
    # fed to the first decoder layer
    hf_model_points = {**LlamaLike.hf_model_points, "embeddings": ("model.layers.0", "in")}

    def layer_config(self, config, i: int) -> LayerConfig:
        return super().layer_config(config, i).replace(
            scale=float(config.attention_multiplier),  # GraniteAttention.scaling
            residual_multiplier=float(config.residual_multiplier),  # GraniteDecoderLayer.forward
        )

    def feature_switches(self, config, features):
        # GraniteAttention.scaling = attention_multiplier; GraniteDecoderLayer.forward:
        # residual + branch * residual_multiplier -- both read from the config
        sw = super().feature_switches(config, features)
        if "attn_scale" in features:
            sw["attn_scale"] = {"attention_multiplier": (config.hidden_size // config.num_attention_heads) ** -0.5}
        if "residual_multiplier" in features:
            sw["residual_multiplier"] = {"residual_multiplier": 1.0}
        return sw

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/granite.py GraniteModel.set_gguf_parameters: head_dim popped,
        # LlamaModel's (TextModel's + vocab_size + rope.dimension_count), then the
        # four multipliers, each `if x := hparams.get(...)` (only when truthy)
        text_model_gguf_params(w, config)
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
        for value, add in ((config.attention_multiplier, w.add_attention_scale),
                           (config.embedding_multiplier, w.add_embedding_scale),
                           (config.residual_multiplier, w.add_residual_scale),
                           (config.logits_scaling, w.add_logit_scale)):
            if value:
                add(value)


    def config_from_gguf(self, meta, shapes, tensors):
        """granite.cpp load_arch_hparams: the RMS eps and the logit scale (required);
        the residual, embedding and attention scales (optional: 0 means none --
        kq_scale 1/sqrt(head_dim), no residual or embedding multiply)."""
        kw = super().config_from_gguf(meta, shapes, tensors)
        kw["logits_scaling"] = meta.get_f32("logit_scale")
        kw["residual_multiplier"] = meta.get_f32("residual_scale", 0.0) or 1.0
        kw["embedding_multiplier"] = meta.get_f32("embedding_scale", 0.0) or 1.0
        hd = kw["hidden_size"] // kw["num_attention_heads"]
        kw["attention_multiplier"] = meta.get_f32("attention.scale", 0.0) or float(hd) ** -0.5
        # "Granite uses rope_finetuned as a switch for rope, so default to true"
        if not meta.get("rope.scaling.finetuned", True):
            meta.refuse("rope.scaling.finetuned", False, "granite without RoPE (rope_pattern off); HF Granite rotates")
        mapping = meta.get("deepstack_mapping", None) or []
        if any(int(v) >= 0 for v in mapping):
            meta.refuse("deepstack_mapping", mapping, "vision deepstack inputs (Granite 4 Vision) are not compared here")
        meta.get("expert_shared_feed_forward_length", None)  # granite-moe-shared only; no experts here (refused)
        return kw


FAMILY = Granite()
