"""gemma3n (text): the attention half of a decoder layer wrapped in AltUp, with
laurel, per-layer inputs and an activation-sparse MLP around it, and KV shared
across the last layers (HF ``Gemma3nForCausalLM``, model type ``gemma3n_text``,
transformers/models/gemma3n/modeling_gemma3n.py; llama.cpp arch ``gemma3n``,
src/models/gemma3n.cpp; converter conversion/gemma.py ``Gemma3NModel``).

What is judged here, and what is the reference's business. The decoder layer
(``Gemma3nTextDecoderLayer.forward``, modeling_gemma3n.py:1271-1323) carries
FOUR AltUp streams: ``predictions = altup.predict(hidden_states)``, the
ACTIVE prediction (``predictions[altup_active_idx]``) goes through the
attention half -- ``input_layernorm`` -> ``self_attn`` ->
``post_attention_layernorm`` -> ``attn_gated = active_prediction + attn`` --
and everything else (laurel, the MLP with activation sparsity, ``altup.correct``,
the per-layer input gate and projection) turns ``attn_gated`` into the four
streams of the next layer. impl computes the attention half; its input
(``layer_in``) is the active prediction, its residual output (``resid_mid``)
``attn_gated``. Both references name them:

- HF: ``layer_in`` = ``input_layernorm``'s input (the active prediction; the
  residual the attention adds to is the same tensor), ``attn_in`` =
  ``self_attn``'s input, ``attn_out`` = ``post_attention_layernorm``'s output,
  ``resid_mid`` = the unnamed ``active_prediction + attn`` (modeling_gemma3n.py
  :1299), computed by ``hf_taps`` as HF computes it: the same torch add, in the
  model's dtype, of those two captured tensors.
- llama.cpp (gemma3n.cpp ``graph``): ``active_prediction`` (cb :142),
  ``attn_norm`` (:146), ``Qcur`` / ``Kcur`` / ``Vcur`` from build_qkv before
  their norms, ``Qcur_pos`` / ``Kcur_pos`` after RoPE (:169, :193),
  ``kq_soft_max`` / ``kqv_out`` in build_attn, ``attn_post_norm`` (:200),
  ``attn_gated`` (:203).

``layer_out`` is NOT a probe either side has as a row: the decoder layer
returns the four corrected AltUp streams ([4, B, T, hidden] in HF, llama.cpp's
``l_out`` [n_embd, n_tokens, n_altup]), which the next layer's predict mixes;
it is not-exposed on both sides with that reason, never compared as a row.
The model-level probes are: ``embeddings`` (HF ``embed_tokens``' output, scaled
by sqrt(hidden); llama.cpp ``inp_scaled``), ``final_norm`` (HF ``norm`` after
the AltUp unembedding; ``result_norm``) and ``logits`` (final softcap 30 on
both sides).

The attention half (HF ``Gemma3nTextAttention``; gemma3n.cpp :145-203):
- ``input_layernorm`` / ``post_attention_layernorm``: ``Gemma3nRMSNorm``,
  ``x * (mean(x^2) + eps)^-0.5 * w`` in float32 -- a plain ``w``, NOT gemma3's
  ``1 + w`` (the converter's ``norm_shift`` is 0: conversion/gemma.py
  ``Gemma3NModel.norm_shift``); impl ``rms``.
- ``q_norm`` / ``k_norm`` (``Gemma3nRMSNorm(head_dim)``) per head BEFORE RoPE;
  ``v_norm`` the same without a weight (``with_scale=False``; gemma3n.cpp :157
  ``ggml_rms_norm(Vcur)``): impl ``v_norm = l2``.
- ``scaling = 1.0`` (modeling_gemma3n.py:1161; gemma3n.cpp :8
  ``f_attention_scale = 1.0f``): the QK norms carry the scale.
- RoPE rotate-half per layer type (``rope_parameters[layer_type]``: sliding
  10000, full 1e6; llama.cpp ``rope.freq_base_swa`` / ``rope.freq_base``), a
  sliding window on the sliding layers.
- KV sharing: ``kv_sharing_modes`` (configuration_gemma3n.py:206-231): the last
  ``num_kv_shared_layers`` layers ``reuse`` the K / V ``store``d by the last
  earlier layer of their type (``shared_kv_states[layer_type]``); they have no
  ``k_proj`` / ``v_proj`` / ``k_norm`` (modeling_gemma3n.py:1174). impl:
  ``LayerConfig.kv_source`` = that layer. llama.cpp shares from layer 20
  whatever the file says (gemma3n.cpp:7 ``n_layer_kv_from_start = 20``,
  llama-hparams.cpp:321 ``has_kv``), reading layer 18's cache for a sliding
  layer and 19's for a full one (llama-model.cpp:2780-2788, the ``reuse``
  callback): the two rules agree exactly when ``num_kv_shared_layers ==
  num_hidden_layers - 20`` and layers 18 / 19 are the last sliding / full
  layers before 20 (the default pattern) -- so the tiny model has 21 layers
  and shares one (layer 20 reads 18). Any other count is a finding
  (findings.toml), measured.

Traps llama.cpp sets (read from the sources; each has a test, test_gemma3n.py):
- hard-coded sizes: ``n_altup`` 4, ``i_altup_act`` 0, ``laurel_rank`` 64,
  ``n_embd_altup`` 256 (llama-hparams.h:264-267, never read from the file; the
  converter asserts ``altup_num_inputs == 4``): the tiny config keeps
  ``laurel_rank`` 64 and ``hidden_size_per_layer_input`` 256, and another value
  is refused for llama.cpp in one line (``reference_refusal``); the per-layer
  token table is ``n_vocab`` rows (gemma3n.cpp:39), so
  ``vocab_size_per_layer_input`` must equal ``vocab_size``.
- activation sparsity on the first 10 layers at the 95% quantile whatever the
  file says (models.h:843-844, gemma3n.cpp:217; the converter's
  ``activation_sparsity_scale`` is never read), with the UNBIASED std
  (gemma3n.cpp:395 ``1 / (n - 1)``) where HF reads ``activation_sparsity_pattern``
  per layer with ``torch.std(unbiased=False)`` (modeling_gemma3n.py:948, 971):
  the tiny config keeps HF's default pattern (10 layers at 0.95, llama.cpp's),
  and what remains -- the std's n / (n - 1) -- changes the MLP of layers 0-9,
  so every layer's input from L1 on: a finding (findings.toml), measured.
- ``attn_k`` / ``attn_v`` / ``attn_k_norm`` are loaded for EVERY layer (gemma3n.cpp
  :50, :54, flags 0), where HF's shared layers have none: llama.cpp refuses the
  converter's own file of a transformers-5 checkpoint ("check_tensor_dims:
  tensor 'blk.20.attn_k.weight' not found"; Google's checkpoints carry them,
  HF ignores them: ``_keys_to_ignore_on_load_unexpected``). The export writes
  the converter's file plus, for each shared layer, its SOURCE layer's three
  tensors -- never read where the two sharing rules agree; where they do not
  (a layer below 20 HF shares), llama.cpp projects that layer's own input with
  them (tests/test_gguf_files.py holds the rest of the file to the converter's,
  tensor for tensor).
- the final logit softcap is 30 whatever the file says (llama-hparams.h:136;
  gemma3n.cpp reads no softcap key), HF's default.

The export mirrors ``Gemma3NModel`` (conversion/gemma.py:486-631):
``Gemma3Model.set_gguf_parameters`` on TextModel's keys, then the AltUp /
per-layer / sharing / sparsity / window-pattern keys; ``filter_tensors``
renames ``*_scale`` to ``*_scale.weight`` (``altup.correct_output_scale``);
``modify_tensors`` stacks ``altup_projections.{0,1,2}`` and
``altup_unembed_projections.{0,1,2}`` into one [3, H, H] tensor each.

Tiny config: 21 layers (the fewest at which llama.cpp shares; layer 20 reads
18), hidden 64, 4 heads of 16, 2 KV heads, intermediate 96, window 4, vocab
128 (the per-layer table too).
"""

from __future__ import annotations

import re
import contextlib

import numpy as np

from contract.layers import LayerConfig, NormSpec, QkNormSpec

from .._gguf_import import llama_like_config, read_hparams, swa_pattern
from ..base import LcPoint, LlamaLike, Point, text_model_gguf_params
from harness.lazy import lazy

torch = lazy("torch")
transformers = lazy("transformers")

# llama-hparams.h:264-267: what gemma3n.cpp takes as given (never read from the file)
LC_FIXED = {"altup_num_inputs": 4, "altup_active_idx": 0, "laurel_rank": 64, "hidden_size_per_layer_input": 256}
# gemma3n.cpp:7 n_layer_kv_from_start; llama-model.cpp's reuse callback: 18 (sliding) / 19 (full)
LC_KV_FROM = 20
# models.h:843-844: n_layer_sparsity, f_sparsity_std_mul = icdf(0.95)
LC_SPARSE_LAYERS, LC_SPARSITY = 10, 0.95
# conversion/gemma.py Gemma3NModel.modify_tensors: the AltUp projections, stacked [n_altup - 1, H, H]
_STACKED = {"altup_proj": "model.altup_projections", "altup_unembd_proj": "model.altup_unembed_projections"}
# gemma3n.cpp:50, :54: what llama.cpp loads for every layer, HF's shared layers have none
_KV_TENSORS = ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight")
_PIECE = re.compile(r"(altup_proj|altup_unembd_proj)\.(\d+)\.weight")
LAYER_OUT = ("the decoder layer's output is four AltUp streams (HF Gemma3nTextDecoderLayer returns "
             "corrected_predictions [altup_num_inputs, B, T, hidden]; gemma3n.cpp l_out is [n_embd, n_tokens, "
             "n_altup]), not a row: the attention half's residual output is resid_mid")


def kv_sources(config) -> list[int | None]:
    """HF's rule (``Gemma3nTextConfig.kv_sharing_modes``): for each layer, the layer whose
    stored K / V it reads (``reuse``: the last earlier ``store`` layer of its type), or None."""
    modes = config.kv_sharing_modes
    out: list[int | None] = []
    for i, mode in enumerate(modes):
        if mode != "reuse":
            out.append(None)
            continue
        t = config.layer_types[i]
        out.append(max(j for j in range(i) if modes[j] == "store" and config.layer_types[j] == t))
    return out


def lc_kv_sources(swa: list[bool]) -> list[int | None]:
    """llama.cpp's rule (llama-model.cpp:2780-2788, llama-hparams.cpp:321): from layer 20 on,
    layer 18's cache for a sliding layer, 19's for a full one."""
    return [None if i < LC_KV_FROM else LC_KV_FROM - (2 if s else 1) for i, s in enumerate(swa)]


def lc_sparsity_pattern(n_layer: int) -> list[float]:
    """llama.cpp's activation sparsity (models.h:843-844, gemma3n.cpp:217): layers 0-9 at
    0.95, whatever the file says."""
    return [LC_SPARSITY if i < LC_SPARSE_LAYERS else 0.0 for i in range(n_layer)]


def shared_kv_attention(lc: LayerConfig, config, i: int) -> LayerConfig:
    """The attention half gemma3n and gemma4 share (HF ``Gemma3nTextAttention`` /
    ``Gemma4TextAttention``): plain-``w`` RMS norms (``Gemma3nRMSNorm`` / ``Gemma4RMSNorm``:
    ``x * w``), ``q_norm`` / ``k_norm`` per head before RoPE, ``v_norm`` without a weight
    (``with_scale=False``), the post norm, ``scaling = 1.0``, and the K / V of the layer
    ``kv_sharing_modes`` names."""
    eps = config.rms_norm_eps
    return lc.replace(
        input_norm=NormSpec("rms", eps),
        qk_norm=QkNormSpec(NormSpec("rms", eps), over="head", where="pre_rope"),
        v_norm=NormSpec("l2", eps),
        post_norm=NormSpec("rms", eps),
        scale=1.0,
        kv_source=kv_sources(config)[i],
    )


class Gemma3n(LlamaLike):
    name = "gemma3n"
    hf_model_type = "gemma3n_text"
    description = ("AltUp-wrapped attention half (active prediction in, attn_gated out), KV shared by the last "
                   "layers, plain-w QK norms, weightless V norm, scale 1, local/global theta and window")
    tiny = dict(
        vocab_size=128, vocab_size_per_layer_input=128, hidden_size=64, intermediate_size=96, num_hidden_layers=21,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, sliding_window=4, num_kv_shared_layers=1, laurel_rank=64,
        hidden_size_per_layer_input=256, altup_num_inputs=4, altup_active_idx=0, final_logit_softcapping=30.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    gguf_arch = "gemma3n"
    # The fuzzer's space (harness/fuzz.py), each knob a key llama.cpp reads for this arch:
    # - heads / head_dim: attention.head_count(_kv), attention.key_length (gemma3n.cpp:151
    #   build_qkv(n_embd_head, n_head, n_head_kv), the QK norms over n_embd_head);
    # - window: attention.sliding_window (gemma3n.cpp:11 n_swa);
    # - depth: 21, 22 or 25 layers with num_kv_shared_layers = n - 20, the counts at which
    #   HF's sharing rule (kv_sharing_modes) gives each shared layer llama.cpp's source --
    #   18 for a sliding one, 19 for a full one (gemma3n.cpp:7, llama-model.cpp:2780-2788);
    #   25 shares a full layer (L24 reads L19). Never fewer than 21 layers (llama.cpp would
    #   share none) nor another shared count (llama.cpp never reads shared_kv_layers): both
    #   are the written kv_sharing finding, not a draw. Above 10 layers HF's default sparsity
    #   pattern is llama.cpp's (configuration_gemma3n.py:146, models.h:843-844), so only the
    #   std finding applies. laurel_rank, hidden_size_per_layer_input, the AltUp sizes and
    #   vocab_size_per_layer_input stay the tiny's (llama-hparams.h:264-267 hard-codes them).
    # - bias: attention_bias biases q/k/v AND o_proj (modeling_gemma3n.py:1169-1185); gemma3n.cpp
    #   has no o bias (build_attn(..., wo, NULL, ...) :171, :196) nor a q bias on a shared
    #   layer (:181 build_lora_mm(wq)), so it runs against HF alone.
    # Not drawn: the RoPE thetas -- a table per layer type (rope_parameters.full_attention /
    # .sliding_attention), whose value the recorded regression groups cannot write.
    fuzz_space = {"knobs": ("heads", "head_dim", "window", "values", "bias"), "hf_only": ("bias",),
                  "values": {("num_hidden_layers", "num_kv_shared_layers"): ((21, 1), (22, 2), (25, 5))}}

    # ------------------------------------------------------------------ HF
    hf_points = {
        # Gemma3nTextDecoderLayer.forward: active_prediction -> input_layernorm -> self_attn
        "layer_in": Point("input_layernorm", "in"),
        "attn_in": Point("self_attn", "in"),
        "q": Point("self_attn.q_proj", "out"),
        "k": Point("self_attn.k_proj", "out"),  # absent on a shared layer (no module: no probe)
        "v": Point("self_attn.v_proj", "out"),
        "attn_branch": Point("self_attn.o_proj", "in"),
        # attn = post_attention_layernorm(attn): what attn_gated adds
        "attn_out": Point("post_attention_layernorm", "out"),
    }
    hf_not_exposed = {"layer_out": LAYER_OUT}
    hf_tapped = {"resid_mid": "computed as HF's own unnamed add (modeling_gemma3n.py:1299 attn_gated = "
                              "active_prediction + attn) on the captured layer_in and attn_out, in HF's dtype"}
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.norm", "out")}

    def hf_points_for(self, config, i: int):
        if kv_sources(config)[i] is None:
            return self.hf_points
        # a shared layer has no k_proj / v_proj (modeling_gemma3n.py:1174): its K / V are its source's
        return {p: pt for p, pt in self.hf_points.items() if p not in ("k", "v")}

    def hf_taps(self, model, config, sink):
        """``resid_mid``: HF adds it unnamed (modeling_gemma3n.py:1299 ``attn_gated =
        active_prediction + attn``); recomputed here as that very add -- the torch tensors
        ``input_layernorm`` reads and ``post_attention_layernorm`` returns, in the
        model's dtype -- so it is HF's value bit for bit."""

        held: dict = {}

        def tap(i):
            def pre(mod, args, kwargs):
                held[i] = args[0] if args else kwargs["hidden_states"]

            def post(mod, args, kwargs, out):
                x = held.pop(i, None)
                if x is not None:
                    sink.setdefault(i)["resid_mid"] = (x + out).detach().to(dtype=torch.float64).cpu().numpy()
            return pre, post

        @contextlib.contextmanager
        def hooked():
            handles = []
            try:
                for i, layer in enumerate(self.decoder_layers(model)):
                    pre, post = tap(i)
                    handles.append(layer.input_layernorm.register_forward_pre_hook(pre, with_kwargs=True))
                    handles.append(layer.post_attention_layernorm.register_forward_hook(post, with_kwargs=True))
                yield
            finally:
                for h in handles:
                    h.remove()

        return hooked()

    def hf_force(self, layer, forced):
        """Teacher-force the ACTIVE prediction (the attention half's input): HF's layer
        input is four streams, so ``altup.predict``'s output has its active stream
        replaced (the rest of the layer -- the residual, laurel, ``altup.correct`` --
        reads the same tensor, as it would HF's own)."""
        altup = layer.altup
        orig = altup.predict
        idx = int(layer.config.altup_active_idx)

        def predict(hidden_states):
            out = orig(hidden_states)
            t = forced()
            if t is None:
                return out
            out = out.clone()
            out[idx] = t.to(dtype=out.dtype)
            return out

        altup.predict = predict

        class Handle:
            def remove(self):
                altup.__dict__.pop("predict", None)

        return Handle()

    # ------------------------------------------------------------------ llama.cpp
    lc_points = {
        "attn_in": LcPoint("attn_norm"),
        "q": LcPoint("Qcur", "pre_rope", "heads"),
        "k": LcPoint("Kcur", "pre_rope", "heads"),  # build_qkv's, before the norm (no Kcur on a reusing layer)
        "v": LcPoint("Vcur", "last", "heads"),  # before ggml_rms_norm: Vcur_normed after
        "q_rope": LcPoint("Qcur_pos", "last", "heads"),
        "k_rope": LcPoint("Kcur_pos", "last", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint("attn_post_norm"),
        "resid_mid": LcPoint("attn_gated"),
    }
    # k / v / k_rope are missing only on llama.cpp's layers from 20 on (below 20 every layer
    # projects its own): a row names them where HF's model projects there and llama.cpp does not
    _LC_NO_KV = ("from layer 20 gemma3n.cpp projects no K / V (hparams.has_kv false, gemma3n.cpp:175-198): it "
                 "reads layer 18's cache (a sliding layer) or 19's (a full one), llama-model.cpp:2780-2788")
    lc_not_exposed = {"layer_out": LAYER_OUT, "k": _LC_NO_KV, "v": _LC_NO_KV, "k_rope": _LC_NO_KV}
    # gemma3n.cpp:102-103: inpL = ggml_scale(inp_embd, sqrt(n_embd)), cb "inp_scaled"
    lc_model_points = {**LlamaLike.lc_model_points, "embeddings": LcPoint("inp_scaled")}

    def lc_points_for(self, config, i: int):
        if i < LC_KV_FROM:
            return self.lc_points
        # gemma3n.cpp:176-193, a layer reading an earlier layer's cache: Q alone, named "Qcur"
        # once, before its reshape ([q_dim, n_tokens]: a row), no Kcur / Vcur
        return {**{p: pt for p, pt in self.lc_points.items() if p not in ("k", "v", "k_rope")},
                "q": LcPoint("Qcur", "last", "rows")}

    def lc_layer_input(self, config, i: int):
        # gemma3n.cpp:140-142: the active prediction of layer i's own AltUp predict
        return f"L{i}.layer_in", LcPoint("active_prediction")

    # ------------------------------------------------------------------ impl
    def layer_config(self, config, i: int) -> LayerConfig:
        return shared_kv_attention(super().layer_config(config, i), config, i)

    rope_per_layer_type = True  # Gemma3nTextModel.forward: position_embeddings[layer_type]
    weight_map = {**LlamaLike.weight_map, "post_attention_layernorm.weight": "post_norm"}

    def finding_values(self, config) -> dict:
        """What llama.cpp's fixed rules make of HF's settings (findings.toml's conditions):
        whether some layer reads another layer's K / V than HF's does (sharing from layer 20,
        18 / 19 the sources), and whether HF's sparsity pattern is not llama.cpp's."""
        swa = [t == "sliding_attention" for t in config.layer_types]
        pattern = [float(x) for x in config.activation_sparsity_pattern]
        return {"kv_sharing_differs": kv_sources(config) != lc_kv_sources(swa),
                "sparsity_pattern_differs": pattern != lc_sparsity_pattern(config.num_hidden_layers)}

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        if "kv_shared" in features:
            # every layer its own K / V (kv_sharing_modes: None everywhere); llama.cpp still
            # shares from layer 20 (findings.toml), feature bisection runs against HF
            sw["kv_shared"] = {"num_kv_shared_layers": 0}
        if "per_layer_theta" in features:
            # the full layers take the sliding layers' theta (rope_parameters per layer type)
            rp = config.rope_parameters
            sw["per_layer_theta"] = {"rope_parameters": {
                **rp, "full_attention": {**rp["full_attention"],
                                         "rope_theta": rp["sliding_attention"]["rope_theta"]}}}
        return sw

    def lc_refusal(self, config) -> str | None:
        bad = [f"{k}={getattr(config, k)!r}" for k, v in LC_FIXED.items() if getattr(config, k) != v]
        if bad:
            return (f"{', '.join(bad)}: gemma3n.cpp takes n_altup 4, i_altup_act 0, laurel_rank 64 and "
                    "n_embd_altup 256 as given (llama-hparams.h:264-267, read from no key); run it against "
                    "--ref hf")
        if config.vocab_size_per_layer_input != config.vocab_size:
            return (f"vocab_size_per_layer_input={config.vocab_size_per_layer_input} != vocab_size="
                    f"{config.vocab_size}: gemma3n.cpp loads per_layer_token_embd with n_vocab rows "
                    "(gemma3n.cpp:39); run it against --ref hf")
        return super().lc_refusal(config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/gemma.py Gemma3Model.set_gguf_parameters: TextModel's keys, then its own --
        # context_length, head_count, the RMS eps, key / value length, rope.freq_base (the full
        # layers' theta) and head_count_kv written again with the values TextModel wrote (the
        # writer overwrites them: the file is the same), and these two:
        text_model_gguf_params(w, config)
        if config.final_logit_softcapping:
            w.add_final_logit_softcapping(config.final_logit_softcapping)
        # hparams.get("sliding_window_pattern") != 1: Gemma3nTextConfig has no such key
        w.add_sliding_window(config.sliding_window)
        # Gemma3NModel.set_gguf_parameters
        w.add_altup_active_idx(config.altup_active_idx)
        w.add_altup_num_inputs(config.altup_num_inputs)
        w.add_embedding_length_per_layer_input(config.hidden_size_per_layer_input)
        w.add_shared_kv_layers(config.num_kv_shared_layers)

        normal = torch.distributions.normal.Normal(0, 1)
        w.add_activation_sparsity_scale([normal.icdf(torch.tensor(s, dtype=torch.float32)).item()
                                         for s in config.activation_sparsity_pattern])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    def gguf_tensor_map(self, config):
        # the stacked AltUp projections: each HF piece under its own name here, stacked by
        # gguf_tensors (and split again by gguf_import_prepare) -- the names never reach a file
        tmap = super().gguf_tensor_map(config)
        for gname, hf in _STACKED.items():
            for i in range(config.altup_num_inputs - 1):
                tmap.mapping[f"{hf}.{i}"] = (None, f"{gname}.{i}")
        return tmap

    def gguf_convert(self, name, data, config, variant=None):
        # Gemma3NModel.filter_tensors: "*_scale" -> "*_scale.weight" (altup.correct_output_scale)
        yield (name + ".weight" if name.endswith("_scale") else name), data

    def gguf_tensors(self, model, config, variant=None):
        n = config.altup_num_inputs - 1
        pending: dict[str, dict[int, np.ndarray]] = {}
        sources = kv_sources(config)
        kept: dict[str, np.ndarray] = {}  # the sources' K / V / K norm (placeholders below)
        wanted = {f"blk.{s}.{t}" for s in sources if s is not None for t in _KV_TENSORS}
        for name, data in super().gguf_tensors(model, config, variant):
            if name in wanted:
                kept[name] = data
            m = _PIECE.fullmatch(name)
            if m is None:
                yield name, data
                continue
            # Gemma3NModel.modify_tensors: _stack_matrices once all n_altup - 1 are in
            parts = pending.setdefault(m.group(1), {})
            parts[int(m.group(2))] = data
            if len(parts) == n:
                yield f"{m.group(1)}.weight", np.stack([parts[i] for i in range(n)], axis=0)
        # gemma3n.cpp:50 / :54 load attn_k / attn_v / attn_k_norm for every layer (flags 0);
        # HF's shared layers have none: the source layer's, which the graph never reads where
        # the two sharing rules agree (module docstring)
        for i, src in enumerate(sources):
            if src is not None:
                for t in _KV_TENSORS:
                    yield f"blk.{i}.{t}", kept[f"blk.{src}.{t}"]

    def gguf_import_prepare(self, tensors, config):
        tensors = dict(tensors)
        # the stacked projections back into their pieces (gguf_tensor_map's names)
        for gname in _STACKED:
            get = tensors.pop(f"{gname}.weight", None)
            if get is None:
                continue
            for i in range(config.altup_num_inputs - 1):
                tensors[f"{gname}.{i}.weight"] = (lambda get=get, i=i: np.asarray(get())[i])
        # HF's shared layers hold no K / V / K norm; the file's (loaded, never read) are dropped
        for i, src in enumerate(kv_sources(config)):
            if src is not None:
                for t in _KV_TENSORS:
                    tensors.pop(f"blk.{i}.{t}", None)
        return super().gguf_import_prepare(tensors, config)

    def config_from_gguf(self, meta, shapes, tensors):
        """gemma3n.cpp load_arch_hparams: ``load_swa_pattern(ml, 5)``, the window, the RMS
        eps, ``rope.freq_base_swa``; the rest llama.cpp takes as given: the scale 1, KV
        shared from layer 20 (18 / 19 the sources), activation sparsity on layers 0-9 at
        0.95, the AltUp / laurel / per-layer sizes (llama-hparams.h), the final softcap
        30. The HF config that computes that model: ``num_kv_shared_layers = n_layer -
        20`` (a file whose pattern makes HF's sources differ from 18 / 19 is refused),
        ``activation_sparsity_pattern`` llama.cpp's."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 5)
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa))
        n = hp.n_layer
        kw["intermediate_size"] = list(hp.n_ff)
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        kw["sliding_window"] = int(meta.get("attention.sliding_window"))
        kw["rope_parameters"] = {
            "full_attention": kw["rope_parameters"],
            "sliding_attention": {"rope_type": "default", "rope_theta": meta.get_f32("rope.freq_base_swa", 10000.0)}}
        kw["layer_types"] = ["sliding_attention" if s else "full_attention" for s in swa]
        kw["num_kv_shared_layers"] = max(0, n - LC_KV_FROM)
        kw["activation_sparsity_pattern"] = lc_sparsity_pattern(n)
        kw["final_logit_softcapping"] = 30.0  # llama-hparams.h:136, read from no key for gemma3n
        kw["vocab_size_per_layer_input"] = kw["vocab_size"]
        kw.update(LC_FIXED)
        kw.pop("tie_word_embeddings", None)  # gemma3n.cpp:28-31: output falls back to token_embd
        if "output.weight" in shapes:
            kw["tie_word_embeddings"] = False
        if n > LC_KV_FROM:

            hf = kv_sources(transformers.AutoConfig.for_model(self.hf_model_type, **kw))
            lc = lc_kv_sources(swa)
            if hf != lc:
                first = next(i for i, (a, b) in enumerate(zip(hf, lc)) if a != b)
                meta.refuse("attention.sliding_window_pattern", swa,
                            f"layer {first} reads layer {lc[first]}'s cache in llama.cpp (18 for a sliding "
                            f"layer, 19 for a full one: llama-model.cpp's reuse callback) and layer {hf[first]}'s "
                            "in HF (the last earlier layer of its type): no HF config computes this file")
        return kw


FAMILY = Gemma3n()
