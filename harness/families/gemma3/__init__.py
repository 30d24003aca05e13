"""gemma3 (text): local/global layers with their own RoPE theta and window,
per-head ``(1 + w)`` RMS QK norm before RoPE, ``(1 + w)`` input and post
norms, and a softmax scale from ``query_pre_attn_scalar`` (HF
``Gemma3ForCausalLM``, model type ``gemma3_text``; llama.cpp
``src/models/gemma3.cpp``).

HF (``modeling_gemma3.py``):
- ``Gemma3RMSNorm``: ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` all in float32
  (impl ``rms1p``); used for ``input_layernorm``, ``q_norm`` / ``k_norm``
  (``dim=head_dim``, applied per head on (B, H, S, D) BEFORE RoPE) and
  ``post_attention_layernorm`` (on the o_proj output, before the residual).
- ``Gemma3Attention.__init__``: ``scaling = query_pre_attn_scalar ** -0.5``;
  the attention call never passes ``softcap`` (``attn_logit_softcapping`` is
  inert).
- ``Gemma3TextModel.forward``: cos/sin per layer type
  (``rope_parameters["sliding_attention"|"full_attention"]["rope_theta"]``,
  i.e. ``rope_local_base_freq`` / ``rope_theta``); sliding layers get the
  sliding-window causal mask (``kv_idx > q_idx - sliding_window``).
- ``Gemma3TextScaledWordEmbedding``: embeddings times ``sqrt(hidden)``.

llama.cpp (``gemma3.cpp``): the converter (``conversion/gemma.py``
``Gemma3Model.modify_tensors``) stores every ``*norm.weight`` as ``w + 1``, so
the graph's plain ``rms_norm * w`` is HF's ``(1 + w)``; NEOX RoPE (no
permutation); ``freq_base_l = get_rope_freq_base(cparams, il)`` -- the SWA
layers read ``rope.freq_base_swa``, written by ``conversion/base.py``
``TextModel.set_gguf_parameters`` from ``rope_parameters["sliding_attention"]``.
The attention scale is NOT read from the file: ``f_attention_scale =
1/sqrt(head_dim)`` (``1/sqrt(n_embd/n_head)`` for the 62-layer 27B), so
llama.cpp agrees with HF only when ``query_pre_attn_scalar == head_dim``.

GGUF window pattern: the converter writes ``sliding_window`` but NOT
``attention.sliding_window_pattern``, so llama.cpp falls back to
``load_swa_pattern(ml, 6)`` (``il % 6 < 5``) whatever HF's ``layer_types``
say. We write the per-layer bool array that ``load_swa_pattern`` reads with
``get_arr`` (``src/llama-model.cpp``), which is what llama.cpp needs to run the
HF layer pattern; the default tiny config's pattern (2) differs from 6, so a
missing key would show.

Configs:
- default (below): 4 layers (sliding, full, sliding, full), window 4, local
  theta 10000 / global theta 1e6, head_dim 16 explicit (HF's default is 256),
  ``query_pre_attn_scalar = head_dim`` so both references agree.
- HF-only ``--set query_pre_attn_scalar=256`` (HF's default): impl follows
  HF's scale; llama.cpp keeps ``1/sqrt(head_dim)`` -- a ``[[finding]]``
  (fixtures/tolerance.toml) with the measured difference.
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_export import NormPlusOne
from .._gguf_import import llama_like_config, read_hparams, swa_pattern
from ..base import LcPoint, LlamaLike, post_norm_points


class Gemma3(NormPlusOne, LlamaLike):
    name = "gemma3"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "window")}
    hf_model_type = "gemma3_text"
    description = "local/global theta and window, (1+w) QK norm, post norm, query_pre_attn_scalar"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, sliding_window=4, sliding_window_pattern=2,
        rope_theta=1000000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=16,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    gguf_arch = "gemma3"
    layer_major = True  # Gemma3DecoderLayer: its own cache layer only (tests/test_layer_major.py)
    # what the export writes beyond the converter / what it relies on (tests switch
    # them off to show llama.cpp then disagrees)
    _write_swa_pattern = True
    _write_freq_base_swa = True
    # Gemma3TextConfig BC kwargs: the int layer pattern and the local theta
    # (popped into rope_parameters["sliding_attention"]) -- both read at construction.
    extra_settable = ("sliding_window_pattern", "rope_local_base_freq", "rope_theta")

    hf_points = post_norm_points("pre_feedforward_layernorm")
    lc_points = {
        **LlamaLike.lc_points,
        "attn_out": LcPoint("attn_post_norm"),
        "resid_mid": LcPoint("sa_out"),
    }
    # gemma3.cpp: inpL = ggml_scale(inp_embd, sqrt(n_embd)), cb "inp_scaled"
    lc_model_points = {**LlamaLike.lc_model_points, "embeddings": LcPoint("inp_scaled")}

    input_norm_kind = post_norm_kind = "rms1p"  # Gemma3RMSNorm
    # Gemma3Attention: q_norm / k_norm = Gemma3RMSNorm(head_dim), before RoPE
    qk_norm = QkNormSpec(NormSpec("rms1p"), over="head", where="pre_rope")
    # Gemma3TextModel.forward: position_embeddings[layer_type]
    rope_per_layer_type = True
    weight_map = {**LlamaLike.weight_map, "post_attention_layernorm.weight": "post_norm"}

    def layer_config(self, config, i: int):
        # Gemma3Attention.scaling; attn_logit_softcapping: never passed to the attention
        # function in HF gemma3 (no softcap)
        return super().layer_config(config, i).replace(scale=float(config.query_pre_attn_scalar) ** -0.5)

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        if "per_layer_theta" in features:
            # one theta for every layer: the global layers take the local theta (10000, the
            # default RoPE theta; Gemma3TextConfig pops rope_theta into full_attention)
            sw["per_layer_theta"] = {"rope_theta": config.rope_parameters["sliding_attention"]["rope_theta"]}
        if "attn_scale" in features:  # Gemma3Attention.scaling = query_pre_attn_scalar ** -0.5
            sw["attn_scale"] = {"query_pre_attn_scalar": config.head_dim}
        return sw

    def gguf_params(self, w, config, variant=None):
        super().gguf_params(w, config, variant)  # freq_base = full_attention theta, key/value length
        rp = config.rope_parameters
        # conversion/base.py TextModel.set_gguf_parameters: rope.freq_base_swa
        if self._write_freq_base_swa:
            w.add_rope_freq_base_swa(rp["sliding_attention"]["rope_theta"])
        # conversion/gemma.py Gemma3Model.set_gguf_parameters
        if config.final_logit_softcapping:
            w.add_final_logit_softcapping(config.final_logit_softcapping)
        w.add_sliding_window(config.sliding_window)
        # not written by the converter (see the module docstring): the per-layer
        # is_swa array gemma3.cpp's load_swa_pattern(ml, 6) reads with get_arr
        if self._write_swa_pattern:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    # conversion/gemma.py Gemma3Model.modify_tensors / norm_shift: "*norm.weight" + 1
    # (NormPlusOne); a tied head is never exported (gemma3.cpp falls back to token_embd)


    def config_from_gguf(self, meta, shapes, tensors):
        """gemma3.cpp load_arch_hparams: ``found_swa && n_swa > 0`` -> the standard
        window, ``load_swa_pattern(ml, 6)`` and ``rope.freq_base_swa`` (default 10000,
        llama_hparams; the sliding layers take no frequency scaling:
        rope_freq_scale_train_swa stays 1); the final softcap (default none); the
        RMS eps; and the attention scale llama.cpp fixes, ``1/sqrt(head_dim)`` --
        ``1/sqrt(n_embd / n_head)`` for the 62-layer 27B -- which HF takes as
        ``query_pre_attn_scalar``."""
        hp = read_hparams(meta)
        n_swa = int(meta.get("attention.sliding_window", 0))
        if n_swa > 0:
            swa = swa_pattern(meta, hp, 6)
            theta_swa = meta.get_f32("rope.freq_base_swa", 10000.0)
        else:
            swa, theta_swa = [False] * hp.n_layer, 10000.0
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                meta.skip(key, "gemma3.cpp reads it only when attention.sliding_window > 0")
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa))
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        kw["final_logit_softcapping"] = meta.get_f32("final_logit_softcapping", 0.0) or None
        kw["attn_logit_softcapping"] = None  # never passed to the attention in HF gemma3, never read by llama.cpp
        kw["rope_parameters"] = {"full_attention": kw["rope_parameters"],
                                 "sliding_attention": {"rope_type": "default", "rope_theta": theta_swa}}
        kw["layer_types"] = ["sliding_attention" if s else "full_attention" for s in swa]
        kw["sliding_window"] = n_swa or 4096  # unused without a sliding layer
        kw["query_pre_attn_scalar"] = hp.n_embd // hp.head if hp.n_layer == 62 else hp.n_embd_head_k
        return kw


FAMILY = Gemma3()
