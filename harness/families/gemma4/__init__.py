"""gemma4 (text): sliding and global layers of different head widths, the global ones
with proportional RoPE, plain-``w`` RMS QK norms, a weightless V norm, scale 1, KV
shared by the last layers and, on the global layers, K = V (HF ``Gemma4ForCausalLM``,
model type ``gemma4_text``, transformers/models/gemma4/modeling_gemma4.py; llama.cpp
arch ``gemma4``, src/models/gemma4.cpp; converter conversion/gemma.py ``Gemma4Model``).

The attention half (HF ``Gemma4TextAttention``; gemma4.cpp graph :195-262):
- ``input_layernorm`` / ``post_attention_layernorm``: ``Gemma4RMSNorm``, ``x *
  (mean(x^2) + eps)^-0.5 * w`` in float32 -- a plain ``w`` (``Gemma4Model.norm_shift``
  is 0: no ``+ 1`` in the file); impl ``rms``. The post norm is on the branch before
  the residual (``attn_out``; llama.cpp ``attn_post_norm``), the residual sum is
  ``resid_mid`` (HF ``pre_feedforward_layernorm``'s input; llama.cpp names it
  ``attn_out``, gemma4.cpp:273).
- ``q_norm`` / ``k_norm`` (``Gemma4RMSNorm(head_dim)``) per head before RoPE;
  ``v_norm`` the same without a weight (``with_scale=False``; gemma4.cpp:248
  ``ggml_rms_norm(Vcur)``): impl ``v_norm = l2``.
- ``scaling = 1.0`` (modeling_gemma4.py ``Gemma4TextAttention.__init__``; gemma4.cpp
  load_arch_hparams ``f_attention_scale = 1.0f``).
- Per layer type (``config.per_layer_config[i]``): the sliding layers have ``head_dim``
  and ``num_key_value_heads``; the global (full) ones ``global_head_dim`` and, where
  ``attention_k_eq_v``, ``num_global_key_value_heads`` (configuration_gemma4.py
  ``__post_init__``). llama.cpp: ``attention.key_length`` is the global width,
  ``attention.key_length_swa`` the sliding one, ``head_count_kv`` an array.
- RoPE: the sliding layers rotate-half at ``rope_parameters.sliding_attention``
  (default, theta 10000); the global ones ``proportional`` (HF
  ``_compute_proportional_rope_parameters``): over the whole global head, the first
  ``partial_rotary_factor * head_dim / 2`` pairs turn, the rest stand still -- impl's
  ``proportional`` kind (impl/rope.py). llama.cpp rotates the whole head (``rope.
  dimension_count`` = the global width) with ``rope_freqs`` 1e30 on the still pairs
  (``Gemma4Model.generate_extra_tensors``; gemma4.cpp:207 ``freq_factors`` on the full
  layers only).
- ``attention_k_eq_v`` (the 26B / 31B checkpoints): a global layer has no ``v_proj``;
  V is the K projection's output, before the K norm, with V's own weightless norm
  (``value_states = key_states`` then ``v_norm``). llama.cpp: no ``attn_v`` tensor,
  ``Vcur = Kcur`` (gemma4.cpp:235). impl takes that layer's ``wv`` as its ``wk``
  (``layer_weights``): the same product. On llama.cpp's side the one tensor is named
  twice, ``cb(Kcur, "Kcur")`` then ``cb(Vcur, "Vcur")`` -- ggml keeps the last name,
  so both probes read ``Vcur``.
- KV sharing: the last ``num_kv_shared_layers`` layers read the K / V stored by the
  last earlier layer of their type (``Gemma4TextConfig.kv_sharing_modes``); they have
  no k / v projections. llama.cpp shares from ``n_layer - shared_kv_layers`` reading
  that index minus 2 for a sliding layer, minus 1 for a full one (llama-model.cpp
  2780-2788 the ``reuse`` callback; gemma4.cpp:12 ``n_layer_kv_from_start``): the two
  rules agree when the two layers before the first shared one are a sliding then a
  full layer -- every released pattern (E2B: 35 layers, 20 shared, layer 14 full, 13
  sliding). Where they do not, llama.cpp computes another model: refused for
  llama.cpp in one line (``lc_refusal``), HF and impl still run.

Outside the attention half (compared only reference against reference, at
``layer_out``): the MLP (GELU-tanh; ``use_double_wide_mlp`` doubles it on the shared
layers), the MoE block (``enable_moe_block``), the per-layer embeddings
(``hidden_size_per_layer_input``), ``layer_scalar`` (``out_scale``), the final logit
softcap.

Tiny config: 6 layers (sliding, full) x 3, the last two sharing (layer 4 reads 2, 5
reads 3 on both sides), hidden 64, 4 heads, sliding heads of 16 over 2 KV heads,
global heads of 32, window 4, per-layer inputs of 8, softcap 30.
"""

from __future__ import annotations

import re

import numpy as np

from contract.layers import ConfigError, LayerConfig

from .._gguf_import import read_hparams, special_tokens, swa_pattern, vocab_of
from ..base import LcPoint, LlamaLike, Point, post_norm_points, text_model_gguf_params
from ..gemma3n import kv_sources, shared_kv_attention

_S, _F = "sliding_attention", "full_attention"
_ROUTER_SCALE = re.compile(r"model\.layers\.(\d+)\.router\.(scale|per_expert_scale)")


def lc_kv_sources(config) -> list[int | None]:
    """llama.cpp's rule (llama-model.cpp:2780-2788, gemma4.cpp:12): from ``n_layer -
    shared_kv_layers`` on, that index minus 2 (a sliding layer) or minus 1 (a full one)."""
    start = config.num_hidden_layers - config.num_kv_shared_layers
    return [None if i < start else start - (2 if t == _S else 1) for i, t in enumerate(config.layer_types)]


def _per(config, layer_type: str, key: str):
    """``key`` of the first layer of ``layer_type`` (config.per_layer_config; the global
    attribute raises for a per-layer key), or of the sliding layers where none is."""
    for i, t in enumerate(config.layer_types):
        if t == layer_type:
            return getattr(config.per_layer_config[i], key)
    return getattr(config.per_layer_config[0], key)


def _k_eq_v(config, i: int) -> bool:
    # Gemma4TextAttention.__init__: use_alternative_attention = attention_k_eq_v and not is_sliding
    return bool(config.attention_k_eq_v) and config.layer_types[i] != _S


class _SlidingView:
    """The config as config.json holds it: the per-layer keys at their sliding (global
    attribute) values -- what the converter's ``hparams`` read."""

    def __init__(self, config):
        self._config = config

    def __getattr__(self, key):
        if key in ("head_dim", "num_key_value_heads"):
            return _per(self._config, _S, key)
        return getattr(self._config, key)


class Gemma4(LlamaLike):
    name = "gemma4"
    hf_model_type = "gemma4_text"
    gguf_arch = "gemma4"
    description = ("sliding / global layers of their own head width, proportional RoPE on the global ones, "
                   "plain-w QK norms, weightless V norm, scale 1, KV shared by the last layers, K = V")
    tiny = dict(
        vocab_size=128, vocab_size_per_layer_input=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, sliding_window=4, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        final_logit_softcapping=30.0, layer_types=[_S, _F] * 3,
        rope_parameters={_S: {"rope_type": "default", "rope_theta": 10000.0},
                         _F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}},
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    # Gemma4TextConfig.__post_init__ pops these two into per_layer_config (the global layers')
    extra_settable = ("global_head_dim", "num_global_key_value_heads")
    # The fuzzer's space, each knob a key gemma4.cpp reads: heads / head_dim (head_count,
    # head_count_kv, key_length_swa), window (attention.sliding_window), and the family's own:
    # depth, pattern and sharing point together (shared_kv_layers, sliding_window_pattern; each
    # choice one where both sharing rules agree -- the tiny's, E2B's four-to-one in miniature,
    # none shared at three-to-one), K = V on the global layers (no attn_v tensor), the softcap.
    fuzz_space = {"knobs": ("heads", "head_dim", "window", "values"), "values": {
        ("num_hidden_layers", "num_kv_shared_layers", "layer_types"): (
            (6, 2, [_S, _F] * 3), (10, 5, ([_S] * 4 + [_F]) * 2), (8, 0, ([_S] * 3 + [_F]) * 2)),
        "attention_k_eq_v": (False, True),
        "final_logit_softcapping": (None, 30.0)}}
    layer_major = False
    # Gemma4TextExperts (@use_experts_implementation): the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    # ------------------------------------------------------------------ HF
    hf_points = post_norm_points("pre_feedforward_layernorm")
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.norm", "out")}

    def hf_points_for(self, config, i: int):
        if kv_sources(config)[i] is not None:
            # a shared layer has no k_proj / v_proj (Gemma4TextAttention.__init__)
            return {p: pt for p, pt in self.hf_points.items() if p not in ("k", "v")}
        if _k_eq_v(config, i):
            # no v_proj: value_states = the k_proj output
            return {**self.hf_points, "v": Point("self_attn.k_proj", "out")}
        return self.hf_points

    # ------------------------------------------------------------------ llama.cpp
    lc_points = {
        "attn_in": LcPoint("attn_norm"),
        # gemma4.cpp:213-246: the projections named before their reshape ([n, tokens]: rows)
        "q": LcPoint("Qcur", "last", "rows"),
        "k": LcPoint("Kcur", "last", "rows"),
        "v": LcPoint("Vcur", "last", "rows"),
        "q_rope": LcPoint("Qcur_pos", "last", "heads"),
        "k_rope": LcPoint("Kcur_pos", "last", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint("attn_post_norm"),  # gemma4.cpp:270
        "resid_mid": LcPoint("attn_out"),  # gemma4.cpp:272-273: attn_post_norm + inpL
        "layer_out": LcPoint("l_out"),
    }
    _LC_NO_KV = ("a shared layer projects no K / V (gemma4.cpp:255-259, hparams.has_kv false): it reads an "
                 "earlier layer's cache (llama-model.cpp:2780-2788 the reuse callback)")
    lc_not_exposed = {"k": _LC_NO_KV, "v": _LC_NO_KV, "k_rope": _LC_NO_KV}
    # gemma4.cpp:168-169: inpL = ggml_scale(inp_embd, sqrt(n_embd)), cb "inp_scaled"
    lc_model_points = {**LlamaLike.lc_model_points, "embeddings": LcPoint("inp_scaled")}

    def lc_points_for(self, config, i: int):
        if lc_kv_sources(config)[i] is not None:
            return {p: pt for p, pt in self.lc_points.items() if p not in ("k", "v", "k_rope")}
        if _k_eq_v(config, i):
            # Vcur = Kcur, the same tensor named twice: ggml keeps the last name (gemma4.cpp:235-238)
            return {**self.lc_points, "k": LcPoint("Vcur", "last", "rows")}
        return self.lc_points

    def lc_canonical(self, probe, arr, lc, config):
        if probe == "v" and arr.ndim == 3 and isinstance(lc, LayerConfig):
            # Vcur before its reshape: [seqs, tokens, kv_heads * D]
            return arr.reshape(*arr.shape[:2], lc.n_kv_heads, lc.dv)
        return super().lc_canonical(probe, arr, lc, config)

    def lc_refusal(self, config) -> str | None:
        hf, lc = kv_sources(config), lc_kv_sources(config)
        if config.num_kv_shared_layers and hf != lc:
            first = next(i for i, (a, b) in enumerate(zip(hf, lc)) if a != b)
            return (f"num_kv_shared_layers={config.num_kv_shared_layers} with layer_types "
                    f"{['s' if t == _S else 'f' for t in config.layer_types]}: layer {first} reads layer {lc[first]}'s "
                    f"cache in llama.cpp (the first shared index minus 2 for a sliding layer, minus 1 for a full "
                    f"one: llama-model.cpp:2780-2788) and layer {hf[first]}'s in HF (the last earlier layer of its "
                    "type, Gemma4TextConfig.kv_sharing_modes); valid: the two layers before the first shared one "
                    "a sliding then a full layer, or run it against --ref hf")
        if config.attention_bias:
            return ("attention_bias=True: gemma4.cpp applies no q / k / v / o bias (build_lora_mm of wq, wk, wv, "
                    "wo alone; load_arch_tensors creates no attn bias tensor, so the converter's file is refused "
                    "for its extra tensors); run it against --ref hf")
        if config.hidden_size_per_layer_input and config.vocab_size_per_layer_input != config.vocab_size:
            return (f"vocab_size_per_layer_input={config.vocab_size_per_layer_input} != vocab_size="
                    f"{config.vocab_size}: gemma4.cpp loads per_layer_token_embd with n_vocab rows "
                    "(load_arch_tensors); run it against --ref hf")
        return super().lc_refusal(config)

    # ------------------------------------------------------------------ impl
    def head_dim(self, config) -> int:
        # config.head_dim is per layer in transformers 5 (AmbiguousGlobalPerLayerAttributeError):
        # the sliding layers' width, as config.json keeps it
        return int(_per(config, _S, "head_dim"))

    def layer_widths(self, config, i: int) -> tuple[int, int]:
        per = config.per_layer_config[i]  # Gemma4TextAttention.__init__: layer_config = per_layer_config[i]
        return int(per.head_dim), int(per.num_key_value_heads)

    def layer_config(self, config, i: int) -> LayerConfig:
        if config.use_bidirectional_attention == "all":
            # Gemma4TextAttention.is_causal = use_bidirectional_attention != "all"
            raise ConfigError("use_bidirectional_attention='all' makes every layer non-causal (Gemma4TextAttention"
                              ".is_causal), which impl cannot express (causal only); valid: None, 'vision' (it acts "
                              "on image tokens alone)")
        return shared_kv_attention(super().layer_config(config, i), config, i)

    rope_per_layer_type = True  # Gemma4TextModel.forward: position_embeddings[layer_type]
    weight_map = {**LlamaLike.weight_map, "post_attention_layernorm.weight": "post_norm"}

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        out = super().layer_weights(model, config, i)
        if _k_eq_v(config, i) and "wk" in out:
            out["wv"] = out["wk"]  # value_states = the k_proj output (no v_proj)
        return out

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        if "kv_shared" in features:
            sw["kv_shared"] = {"num_kv_shared_layers": 0}
        # no per_layer_theta switch: one theta for both types leaves the global layers' RoPE
        # another kind (proportional) over another width -- the layers still differ
        return sw

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/gemma.py Gemma3Model.set_gguf_parameters: TextModel's keys, then its own
        # (on config.json's view: head_dim / num_key_value_heads are the sliding layers', which
        # transformers 5 refuses to read globally -- the keys are rewritten just below)
        text_model_gguf_params(w, _SlidingView(config))
        if config.final_logit_softcapping:
            w.add_final_logit_softcapping(config.final_logit_softcapping)
        w.add_sliding_window(config.sliding_window)  # hparams.get("sliding_window_pattern") != 1
        # Gemma4Model.set_gguf_parameters
        w.add_shared_kv_layers(config.num_kv_shared_layers)
        w.add_embedding_length_per_layer_input(config.hidden_size_per_layer_input or 0)
        swa = [t == _S for t in config.layer_types]
        w.add_sliding_window_pattern(swa)
        hd_full, hd_swa = int(_per(config, _F, "head_dim")), int(_per(config, _S, "head_dim"))
        w.add_key_length(hd_full)
        w.add_value_length(hd_full)
        w.add_key_length_swa(hd_swa)
        w.add_value_length_swa(hd_swa)
        if config.moe_intermediate_size is not None:
            w.add_expert_feed_forward_length(config.moe_intermediate_size)
        first_shared = config.num_hidden_layers - config.num_kv_shared_layers
        if config.use_double_wide_mlp:
            n_ff = config.intermediate_size
            w.add_feed_forward_length([n_ff if i < first_shared else 2 * n_ff for i in range(config.num_hidden_layers)])
        kv_full = _per(config, _F, "num_key_value_heads") if config.attention_k_eq_v else None
        if kv_full is not None:
            w.add_head_count_kv([int(_per(config, _S, "num_key_value_heads")) if s else int(kv_full) for s in swa])
        # proportional on the full layers: n_rot = the global head (rope_freqs stills the rest)
        w.add_rope_dimension_count(hd_full)
        w.add_rope_dimension_count_swa(int(hd_swa * float(config.rope_parameters.get("partial_rotary_factor", 1.0))))

    def gguf_extra_tensors(self, config, variant=None):
        """``Gemma4Model.generate_extra_tensors``: ``rope_freqs`` [global head / 2], 1 for
        the pairs proportional RoPE turns, 1e30 for the still ones."""
        rp = config.rope_parameters[_F]
        hd = int(_per(config, _F, "head_dim"))
        turned = int(hd * float(rp["partial_rotary_factor"]) / 2)
        yield "rope_freqs.weight", np.asarray([1.0] * turned + [1e30] * (hd // 2 - turned), dtype=np.float32)

    def gguf_convert(self, name, data, config, variant=None):
        # Gemma4Model.filter_tensors: "layer_scalar" -> "layer_scalar.weight", and an experts tensor
        # ("experts.gate_up_proj", "experts.down_proj": parameters, no ".weight") gets one
        if name.endswith("layer_scalar") or (".experts." in name and not name.endswith(".weight")):
            name += ".weight"
        yield name, data

    def gguf_hf_tensor(self, name, data, config, variant, tmap):
        # Gemma4Model.modify_tensors: the router's scale and per-expert scale go by names gguf's
        # tensor map has no HF entry for (FFN_GATE_INP ".scale", FFN_DOWN_EXP ".scale")
        m = _ROUTER_SCALE.fullmatch(name)
        if m is not None:
            kind = "ffn_gate_inp" if m.group(2) == "scale" else "ffn_down_exps"
            yield f"blk.{m.group(1)}.{kind}.scale", data
            return
        yield from super().gguf_hf_tensor(name, data, config, variant, tmap)

    def config_from_gguf(self, meta, shapes, tensors):
        """gemma4.cpp load_arch_hparams: the per-layer sliding pattern, ``shared_kv_layers``
        (from ``n_layer - shared`` each layer reads index - 2 / - 1: the HF config whose
        ``kv_sharing_modes`` agree, else refused), the window, the eps, the two head widths
        (``key_length`` / ``key_length_swa``), ``head_count_kv`` per layer, the per-layer
        input width, the final softcap, ``rope.freq_base_swa``; proportional RoPE from the
        ``rope_freqs`` tensor (the pairs at 1)."""
        if any(k.endswith("ffn_gate_inp.weight") for k in shapes):
            meta.refuse("expert_count", meta.get("expert_count", 0),
                        "gemma4's MoE block (enable_moe_block) is not read back from a file here yet; the dense "
                        "checkpoints (E2B, E4B, 31B) are")
        hp = read_hparams(meta)
        n = hp.n_layer
        swa = swa_pattern(meta, hp, 0)
        types = [_S if s else _F for s in swa]
        kv = [int(x) for x in hp.n_head_kv]
        kv_swa = next((kv[i] for i in range(n) if swa[i]), kv[0])
        kv_full = next((kv[i] for i in range(n) if not swa[i]), kv[0])
        hd_full, hd_swa = int(hp.n_embd_head_k), int(hp.n_embd_head_k_swa)
        ff = tensors.get("rope_freqs.weight")
        prf = 1.0
        if ff is not None:
            ffa = np.asarray(ff() if callable(ff) else ff, dtype=np.float64)
            prf = 2.0 * int(np.sum(ffa == 1.0)) / hd_full
        k_eq_v = not any(f"blk.{i}.attn_v.weight" in shapes for i in range(n) if not swa[i]) and _F in types
        vocab = vocab_of(meta, shapes)
        ple = int(meta.get("embedding_length_per_layer_input", 0))
        kw = {
            "num_hidden_layers": n, "max_position_embeddings": hp.n_ctx_train, "hidden_size": hp.n_embd,
            "intermediate_size": int(hp.n_ff[0]), "num_attention_heads": int(hp.n_head[0]),
            "num_key_value_heads": kv_swa, "head_dim": hd_swa, "global_head_dim": hd_full,
            "vocab_size": vocab, "vocab_size_per_layer_input": vocab, "hidden_size_per_layer_input": ple,
            "rms_norm_eps": meta.get_f32("attention.layer_norm_rms_epsilon"),
            "sliding_window": int(meta.get("attention.sliding_window")), "layer_types": types,
            "num_kv_shared_layers": int(meta.get("attention.shared_kv_layers", 0)),
            "final_logit_softcapping": meta.get_f32("final_logit_softcapping", 0.0) or None,
            "attention_k_eq_v": k_eq_v, "tie_word_embeddings": "output.weight" not in shapes,
            "rope_parameters": {
                _S: {"rope_type": "default", "rope_theta": meta.get_f32("rope.freq_base_swa", 10000.0)},
                _F: {"rope_type": "proportional", "partial_rotary_factor": prf,
                     "rope_theta": float(hp.rope_freq_base)}},
            **special_tokens(meta, vocab),
        }
        if k_eq_v:
            kw["num_global_key_value_heads"] = kv_full
        return kw


FAMILY = Gemma4()
