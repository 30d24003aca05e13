"""phi3: a fused QKV projection, partial neox RoPE with LongRoPE's short / long
factor sets and their attention factor, an optional sliding window (HF
``Phi3ForCausalLM``; llama.cpp ``src/models/phi3.cpp``, converter
``conversion/phi.py`` ``Phi3MiniModel``).

HF (``modeling_phi3.py``):
- ``Phi3Attention.forward``: ``qkv = qkv_proj(x)``, split as ``[Q | K | V]``
  (``query_pos = n_head * head_dim``, then ``n_kv_head * head_dim`` for K), no
  biases; ``apply_rotary_pos_emb`` rotates the leading ``cos.shape[-1]`` channels
  (rotate-half) and passes the rest; ``sliding_window=config.sliding_window``.
- ``Phi3RotaryEmbedding`` / ``modeling_rope_utils._compute_longrope_parameters``:
  ``inv_freq = 1 / (ext_factors * base ** (2i / dim))`` with ``dim = head_dim *
  partial_rotary_factor``; ``ext_factors`` is ``short_factor``, or ``long_factor``
  for a sequence longer than ``original_max_position_embeddings``
  (``longrope_frequency_update``: ``max(position_ids) + 1``, per forward call);
  ``attention_factor = sqrt(1 + ln(factor) / ln(original_max))`` with ``factor =
  max_position_embeddings / original_max_position_embeddings`` (phi3's top-level
  ``original_max_position_embeddings`` wins over the rope dict's:
  ``standardize_rope_params``), multiplied onto cos and sin.
- ``Phi3Model``: ``create_sliding_window_causal_mask`` when
  ``config.sliding_window`` is set, else causal.

llama.cpp (``phi3.cpp``): RMS ``attn_norm``, ``build_qkv`` views of the fused
``wqkv``, ``ggml_rope_ext(..., rope_factors, n_rot, NEOX, ...)`` with
``model.get_rope_factors(cparams, il)`` -- ``rope_long`` when the context per
sequence ``n_ctx_seq > n_ctx_orig_yarn``, else ``rope_short`` (src/llama-model.cpp)
-- and ``attn_factor`` = ``rope.scaling.attn_factor`` (llama-context.cpp:
``yarn_attn_factor *= hparams.rope_attn_factor``); ``Qcur`` scaled by
``1/sqrt(head_dim)`` before ``build_attn`` (scale 1). ``load_arch_hparams``:
"Phi SWA is currently disabled" -- any ``sliding_window`` is dropped
(``swa_type = NONE``). No tensor is named for ``wo``'s output nor for the
residual after attention: ``attn_out`` / ``resid_mid`` are not exposed.

Converter (``Phi3MiniModel``): ``rope.dimension_count = int(rot_pct * n_embd) //
n_head``, ``rope.scaling.original_context_length``, ``attention.sliding_window``
(0 for None), NO ``rope.scaling.type``; ``generate_extra_tensors`` writes
``rope_factors_long`` / ``rope_factors_short`` and ``rope.scaling.attn_factor =
sqrt(1 + ln(max / orig) / ln(orig))`` (from the two lengths, whatever HF's
``factor`` / ``attention_factor`` say). Tensors keep HF's fused layout
(``qkv_proj`` -> ``attn_qkv``, ``gate_up_proj`` -> ``ffn_up``, SWIGLU gate first).

Which factor set (``impl.rope.make_rope(..., which=)``): HF picks by the sequence
length, llama.cpp by the context size; the harness runs llama.cpp with
``n_ctx_seq = max(256, ...)`` (references/llamacpp/capture.py), so for a case of
up to 256 tokens llama.cpp takes ``long`` iff ``original_max_position_embeddings
< 256``, and so does impl (``LONGROPE_CONTEXT``). The tiny default (original 256)
is short on every side; ``--set original_max_position_embeddings=8`` is long on
every side from 9 tokens; between (a sequence no longer than an original below
256) HF takes short and llama.cpp long: a finding.
"""

from __future__ import annotations

import math

import numpy as np

from impl import make_rope

from .._convert import longrope_factor_tensors, longrope_factors_of, without_longrope_tensors
from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, Point, tensor
from contract.layers import WindowSpec

# the context per sequence llama.cpp runs with in the harness for cases up to 256
# tokens (references/llamacpp/capture.py: n_ctx = n_seq * max(256, ...)): what
# llama_model::get_rope_factors compares with n_ctx_orig_yarn
LONGROPE_CONTEXT = 256


class Phi3(LlamaLike):
    name = "phi3"
    hf_model_type = "phi3"
    description = "fused QKV, partial neox RoPE with LongRoPE short / long factors, optional window llama.cpp drops"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        original_max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "short_factor": [1.0, 1.25, 1.875, 2.5], "long_factor": [1.5, 3.0, 7.0, 13.0]},
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    gguf_arch = "phi3"
    fuzz_space = {"knobs": ("heads", "theta")}
    _qkv = Point("self_attn.qkv_proj", "out")
    hf_points = {**{k: v for k, v in LlamaLike.hf_points.items() if k not in ("q", "k", "v")},
                 "q": _qkv, "k": _qkv, "v": _qkv}
    # phi3.cpp names neither wo's product nor the residual after attention
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k not in ("attn_out", "resid_mid")}
    switch_params = {**LlamaLike.switch_params}
    _has_experts = False  # phimoe reads phi3's RoPE keys with its experts (config_from_gguf)

    def config_kwargs(self, overrides: dict) -> dict:
        """The tiny config with the overrides; where they change the rotated width
        and leave the factor lists alone, the tiny lists are stretched to it
        (HF's _check_received_keys / validate_rope wants rot/2 factors each), so a
        size override (the default matrix's kquant hidden_size = 256) builds."""
        kw = super().config_kwargs(overrides)
        rp = kw.get("rope_parameters") or {}
        hidden, heads = kw.get("hidden_size"), kw.get("num_attention_heads")
        hd = kw.get("head_dim") or (hidden // heads if hidden and heads else None)
        if hd and rp.get("rope_type") == "longrope":
            want = int(hd * rp.get("partial_rotary_factor", 1.0)) // 2
            for name in ("short_factor", "long_factor"):
                f = rp.get(name)
                set_here = any(k == f"rope_parameters.{name}" for k in overrides)
                if isinstance(f, list) and f and len(f) != want and not set_here:
                    rp[name] = [float(x) for x in np.interp(np.linspace(0, len(f) - 1, want), range(len(f)), f)]
        return kw

    def head_dim(self, config) -> int:
        # Phi3Attention: getattr(config, "head_dim", hidden // heads)
        return config.hidden_size // config.num_attention_heads

    def _rope_set(self, config) -> str:
        """The LongRoPE factor set this case runs (module docstring)."""
        orig = config.rope_parameters["original_max_position_embeddings"]
        return "long" if orig < LONGROPE_CONTEXT else "short"

    def rope(self, config, i: int, head_dim: int):
        rp = dict(config.rope_parameters)
        rot = int(head_dim * rp.get("partial_rotary_factor", 1.0))
        if rp.get("rope_type") != "longrope":
            return make_rope(rp.get("rope_type", "default"), rp["rope_theta"], rot, "neox", rp)
        rp.update(max_position_embeddings=config.max_position_embeddings, which=self._rope_set(config))
        return make_rope("longrope", rp["rope_theta"], rot, "neox", rp)

    def window(self, config, i: int):
        # Phi3Model: a sliding-window mask on every layer where config.sliding_window is set
        return WindowSpec("sliding", int(config.sliding_window)) if config.sliding_window else None

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        h, hkv, d = config.num_attention_heads, config.num_key_value_heads, self.head_dim(config)
        qkv = tensor(layer, "self_attn.qkv_proj.weight")  # Phi3Attention.forward: [Q | K | V] rows
        return {"attn_norm": tensor(layer, "input_layernorm.weight"),
                "wq": qkv[: h * d], "wk": qkv[h * d: (h + hkv) * d], "wv": qkv[(h + hkv) * d:],
                "wo": tensor(layer, "self_attn.o_proj.weight")}

    def hf_canonical(self, probe, arr, lc):
        if probe in ("q", "k", "v") and arr.ndim == 3:
            h, hkv, d = lc.n_heads, lc.n_kv_heads, lc.head_dim
            lo, hi = {"q": (0, h * d), "k": (h * d, (h + hkv) * d), "v": ((h + hkv) * d, (h + 2 * hkv) * d)}[probe]
            return arr[..., lo:hi].reshape(*arr.shape[:2], -1, d)
        return super().hf_canonical(probe, arr, lc)

    # ------------------------------------------------------------------ GGUF
    def _rope_dims(self, config) -> int:
        # Phi3MiniModel: int(rot_pct * n_embd) // n_head (hidden // heads, not head_dim)
        rp = config.rope_parameters
        return int(rp.get("partial_rotary_factor", 1.0) * config.hidden_size) // config.num_attention_heads

    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/phi.py Phi3MiniModel.set_gguf_parameters (no TextModel super call)
        rp = config.rope_parameters
        w.add_context_length(config.max_position_embeddings)
        # find_hparam(["original_max_position_embeddings"]): HF phi3 keeps it in rope_parameters
        # (standardize_rope_params), phimoe's plain RoPE as the top-level key config.json has
        orig = rp.get("original_max_position_embeddings", getattr(config, "original_max_position_embeddings", None))
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_rope_dimension_count(self._rope_dims(config))
        w.add_rope_freq_base(rp["rope_theta"])
        # "use zero value of sliding_window to distinguish Phi-4 from other PHI3 models"
        w.add_sliding_window(config.sliding_window or 0)
        if rp.get("long_factor"):
            # generate_extra_tensors: the attention factor from the two lengths alone
            scale = config.max_position_embeddings / orig
            attn = math.sqrt(1 + math.log(scale) / math.log(orig)) \
                if scale > 1.0 else 1.0
            w.add_rope_scaling_attn_factors(attn)

    def gguf_tensors(self, model, config, variant=None):
        yield from super().gguf_tensors(model, config, variant)
        rp = config.rope_parameters
        yield from longrope_factor_tensors(rp)

    def gguf_import_prepare(self, tensors, config):
        return super().gguf_import_prepare(without_longrope_tensors(tensors), config)

    def config_from_gguf(self, meta, shapes, tensors):
        """phi3.cpp load_arch_hparams: the RMS eps and the (ignored) sliding window;
        the LongRoPE factor tensors and ``rope.scaling.attn_factor`` (read_hparams)
        are the rope parameters HF computes the same rotation from."""
        hp = read_hparams(meta)
        d = hp.n_embd // hp.head
        rp = {"rope_type": "default", "rope_theta": hp.rope_freq_base}
        if hp.n_rot != d:
            rp["partial_rotary_factor"] = hp.n_rot / d
        factors = longrope_factors_of(tensors)
        if factors is not None:
            rp.update(rope_type="longrope", **factors)
            scale = hp.n_ctx_train / hp.n_ctx_orig_yarn
            want = math.sqrt(1 + math.log(scale) / math.log(hp.n_ctx_orig_yarn)) if scale > 1.0 else 1.0
            if abs(hp.rope_attn_factor - want) > 1e-6 * want:
                rp["attention_factor"] = hp.rope_attn_factor
        elif hp.rope_attn_factor != 1.0:
            meta.refuse("rope.scaling.attn_factor", hp.rope_attn_factor, "an attention factor without LongRoPE "
                        "factor tensors; HF's phi3 default RoPE has none")
        kw = llama_like_config(self, meta, shapes, hp, rotary=False, rope=rp, moe=self._has_experts)
        # phimoe.cpp load_arch_hparams reads no window at all (phi3.cpp reads it, then drops it)
        swa = int(meta.get("attention.sliding_window", 0)) if not self._has_experts else 0
        kw.update(original_max_position_embeddings=hp.n_ctx_orig_yarn,
                  rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  # phi3.cpp disables SWA whatever the key says: the model llama.cpp runs has none
                  sliding_window=None)
        if swa:
            meta.skip("attention.sliding_window", "phi3.cpp load_arch_hparams: 'Phi SWA is currently disabled'")
        return kw


FAMILY = Phi3()
