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

from contract.layers import NormSpec, QkNormSpec

from ..base import LcPoint, LlamaLike, post_norm_points


class Olmo2(LlamaLike):
    name = "olmo2"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta")}
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

    # attn_in: the raw layer input (no input norm); Olmo2DecoderLayer: residual +
    # post_norm(attn) feeds the MLP
    hf_points = post_norm_points("mlp")
    lc_points = {
        # no attn_norm in olmo2.cpp: the attention reads inpL itself
        **{k: v for k, v in LlamaLike.lc_points.items() if k != "attn_in"},
        "q": LcPoint("Qcur", "pre_rope", "rows"),  # 2-D (n_embd, tokens): reshape=false
        "k": LcPoint("Kcur", "pre_rope", "rows"),
        # v: the reshape_3d, cb'd after RoPE
        "attn_out": LcPoint("attn_post_norm"),
    }

    # Olmo2Attention: q_norm = Olmo2RMSNorm(num_heads * head_dim), before the view
    qk_norm = QkNormSpec(NormSpec("rms"), over="row", where="pre_rope")
    post_norm_kind = "rms"  # post_attention_layernorm on the branch
    weight_map = {**LlamaLike.weight_map, "post_attention_layernorm.weight": "post_norm"}

    def layer_config(self, config, i: int):
        # Olmo2DecoderLayer has no input_layernorm
        return super().layer_config(config, i).replace(input_norm=NormSpec("none"))

    def config_from_gguf(self, meta, shapes, tensors):
        kw = super().config_from_gguf(meta, shapes, tensors)  # olmo2.cpp: the RMS eps, then
        # `found_swa && n_swa > 0`: load_swa_pattern(ml, 4) and rope.freq_base_swa (OLMo 3);
        # HF's Olmo2 has no sliding window
        n_swa = int(meta.get("attention.sliding_window", 0))
        if n_swa > 0:
            meta.refuse("attention.sliding_window", n_swa, "sliding layers (OLMo 3); HF Olmo2 has no sliding window")
        for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
            meta.skip(key, "olmo2.cpp reads it only when attention.sliding_window > 0")
        return kw


FAMILY = Olmo2()
