"""olmo2: no input norm, a whole-row RMS QK norm before RoPE, and a
post-attention norm before the residual (HF ``Olmo2ForCausalLM``; llama.cpp
``src/models/olmo2.cpp``).

HF (``modeling_olmo2.py``):
- ``Olmo2DecoderLayer.forward``: ``self_attn`` reads the RAW layer input (the
  layer has no ``input_layernorm``); ``hidden = residual +
  post_attention_layernorm(attn)``; the MLP half has no pre-norm either.
- ``Olmo2Attention.forward``: ``q_norm(q_proj(x))`` with ``q_norm =
  Olmo2RMSNorm(num_heads * head_dim)`` -- over the whole projected row, before
  the head split and before RoPE ("unlike olmo, only on the head dim" is
  qwen3's remark about the difference); then neox RoPE with one theta.
- ``Olmo2RMSNorm.forward``: ``(weight * x_fp32_normed).to(input_dtype)`` (weight
  applied before the cast back; identical to llama's order at float32).
- There is no ``clip_qkv`` (``modular_olmo2.py`` deletes it from the config);
  see the ``olmo`` family for the clamp.

llama.cpp (``olmo2.cpp``): no ``attn_norm``; ``build_qkv(..., reshape=false)``
leaves Q/K/V as 2-D rows named ``Qcur``/``Kcur``/``Vcur``; ``attn_q_norm`` is
``{n_embd}`` (whole row); NEOX RoPE (``llama_model_rope_type``), so the
converter (``conversion/olmo.py`` ``Olmo2Model``) writes the tensors as they
are -- no permutation. ``output.weight`` is required (no tie fallback).

Default config: 2 layers, 4 query / 2 KV heads, head_dim 16.
"""

from __future__ import annotations

import numpy as np

from impl import NormSpec, QkNormSpec

from .base import LcPoint, LlamaLike, Point, rope_from_config


class Olmo2(LlamaLike):
    name = "olmo2"
    hf_model_type = "olmo2"
    description = "no input norm, whole-row QK RMS norm, post-attention norm"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,  # olmo2.cpp: output.weight is required
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "olmo2"
    # llama.cpp's olmo2 hard-codes n_embd_head = n_embd / n_head (load_arch_tensors),
    # so a head_dim override could not be exported.
    extra_settable = ()

    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attn", "in"),  # the raw layer input: no input norm
        "q": Point("self_attn.q_proj", "out"),
        "k": Point("self_attn.k_proj", "out"),
        "v": Point("self_attn.v_proj", "out"),
        "attn_branch": Point("self_attn.o_proj", "in"),
        "attn_out": Point("post_attention_layernorm", "out"),
        "resid_mid": Point("mlp", "in"),  # Olmo2DecoderLayer: residual + post_norm(attn) feeds the MLP
        "layer_out": Point("", "out"),
    }
    lc_points = {
        # no attn_norm in olmo2.cpp: the attention reads inpL itself
        "q": LcPoint("Qcur", "pre_rope", "rows"),  # 2-D (n_embd, tokens): reshape=false
        "k": LcPoint("Kcur", "pre_rope", "rows"),
        "v": LcPoint("Vcur", "last", "heads"),  # the reshape_3d, cb'd after RoPE
        "q_rope": LcPoint("Qcur", "rope", "heads"),
        "k_rope": LcPoint("Kcur", "rope", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint("attn_post_norm"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }

    def layer_config(self, config, i: int):
        hd = self.head_dim(config)
        eps = config.rms_norm_eps
        from impl import LayerConfig

        return LayerConfig(
            hidden_size=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads,
            head_dim=hd,
            input_norm=NormSpec("none"),  # Olmo2DecoderLayer has no input_layernorm
            # Olmo2Attention: q_norm = Olmo2RMSNorm(num_heads * head_dim), before the view
            qk_norm=QkNormSpec(NormSpec("rms", eps), over="row", where="pre_rope"),
            rope=rope_from_config(config, head_dim=hd),
            post_norm=NormSpec("rms", eps),  # post_attention_layernorm on the branch
        )

    def layer_weights(self, model, config, i):
        w = super().layer_weights(model, config, i)
        from .base import tensor

        w["post_norm"] = tensor(self.decoder_layers(model)[i], "post_attention_layernorm.weight")
        return w

    def lc_canonical(self, probe, arr, lc, config):
        if probe in ("q", "k") and arr.ndim == 3:  # [seqs, tokens, heads * D] rows
            n = lc.n_heads if probe == "q" else lc.n_kv_heads
            return arr.reshape(arr.shape[0], arr.shape[1], n, lc.head_dim)
        return super().lc_canonical(probe, arr, lc, config)


FAMILY = Olmo2()
