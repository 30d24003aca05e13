"""olmo (v1): the QKV clamp (``clip_qkv``) and a LayerNorm with neither weight
nor bias (HF ``OlmoForCausalLM``; llama.cpp ``src/models/olmo.cpp``).

Added for the QKV clamp: olmo2 -- the family issue 9 names -- has none (HF
``modular_olmo2.py`` deletes ``clip_qkv`` from its config, and llama.cpp's
olmo2 graph calls ``build_qkv(..., reshape=false)``, which skips the clamp), so
OLMo v1 is the family that verifies the clamp against both references.

HF (``modeling_olmo.py``):
- ``OlmoLayerNorm``: ``F.layer_norm(x_fp32, (hidden,), None, None, eps=1e-5)``
  -- mean-centred, no weight, no bias, eps fixed at 1e-5 -- for the input and
  post-attention norms (and the final norm).
- ``OlmoAttention.forward``: ``q_proj / k_proj / v_proj`` then, if
  ``config.clip_qkv``, ``.clamp_(-clip_qkv, clip_qkv)`` IN PLACE on each
  projection output, then the head split and neox RoPE.

llama.cpp: ``load_arch_hparams`` reads ``olmo.attention.clamp_kqv``
(optional) and ``build_qkv`` clamps Q, K and V after the projection (and bias)
-- cb ``Qcur_clamped`` -- before the reshape; ``LLM_NORM`` with no weight;
NORM RoPE, so the converter (``conversion/olmo.py`` ``OlmoModel``) permutes
``q_proj`` / ``k_proj`` rows like llama and writes ``clamp_kqv`` from
``clip_qkv`` and ``layer_norm_eps = 1e-5``.

Probe ``q``/``k``/``v`` is what follows projection, bias and clamp (the
spec's ``apply_qkv_bias_and_clamp``). HF's module hooks copy the projection
output BEFORE the in-place clamp, so ``hf_taps`` keeps a reference to the
projection outputs and reads them after the forward: the very tensors HF
clamped and went on with.

Default config: 2 layers, 4 query / 2 KV heads, ``clip_qkv = 1.0`` (about a
third of the Q/K/V entries of the tiny model are clamped).
"""

from __future__ import annotations

import contextlib

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike
from ..llama import Llama
from harness.references.hf.capture import _to_np


class Olmo(Llama):
    name = "olmo"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta")}
    hf_model_type = "olmo"
    description = "QKV clamp (clip_qkv), weightless LayerNorm, llama permute"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        clip_qkv=1.0, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "olmo"
    _write_clamp = True  # what the converter does; a test switches it off
    # conversion/olmo.py OlmoModel is a TextModel: llama's permute, but no rope_freqs
    converter_rope_freqs = False
    # olmo.cpp sizes wq / wo as n_embd x n_embd: head_dim is hidden // heads
    extra_settable = ()

    hf_points = {k: v for k, v in LlamaLike.hf_points.items() if k not in ("q", "k", "v")}
    # llama.cpp: LlamaLike's points. build_qkv names Qcur [MUL_MAT] -> Qcur_clamped ->
    # Qcur [RESHAPE], so "pre_rope" reads the reshape of the CLAMPED projection; olmo.cpp
    # gives build_attn's wo product no name, so attn_out is not exposed.

    input_norm_kind = "layer"  # OlmoLayerNorm: no weight, no bias, eps 1e-5

    def head_dim(self, config) -> int:
        return config.hidden_size // config.num_attention_heads

    def norm_eps(self, config) -> float:
        return 1e-5

    def layer_config(self, config, i: int):
        return super().layer_config(config, i).replace(
            qkv_clamp=None if config.clip_qkv is None else float(config.clip_qkv))

    def hf_taps(self, model, config, sink: dict):
        """Read q/k/v after OlmoAttention's in-place ``clamp_``: keep the projection
        outputs (no copy) and read them once the attention's forward is done (per
        call: HF's cached path runs the attention once per call of the schedule)."""

        @contextlib.contextmanager
        def taps():
            held: list[tuple[int, str, object]] = []
            handles = []

            def flush():
                for i, probe, t in held:
                    sink.setdefault(i, {})[probe] = _to_np(t)
                held.clear()

            for i, layer in enumerate(self.decoder_layers(model)):
                for probe in ("q", "k", "v"):
                    mod = getattr(layer.self_attn, f"{probe}_proj")

                    def hook(m, args, out, __i=i, __p=probe):
                        held.append((__i, __p, out.detach()))  # shares storage: sees the clamp_

                    handles.append(mod.register_forward_hook(hook))
                handles.append(layer.self_attn.register_forward_hook(lambda m, args, out: flush()))
            try:
                yield
            finally:
                for h in handles:
                    h.remove()
            flush()

        return taps()

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        if "qkv_clamp" in features:
            sw["qkv_clamp"] = {"clip_qkv": None}
        return sw

    def config_from_gguf(self, meta, shapes, tensors):
        # olmo.cpp load_arch_hparams: layer_norm_eps (required), clamp_kqv (optional;
        # build_qkv clamps when > 0)
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp)
        eps = meta.get_f32("attention.layer_norm_epsilon")
        if eps != 1e-5:
            meta.refuse("attention.layer_norm_epsilon", eps, "HF OlmoLayerNorm fixes eps at 1e-5")
        clamp = meta.get_f32("attention.clamp_kqv", 0.0)
        kw["clip_qkv"] = clamp if clamp > 0 else None
        return kw

    def gguf_params(self, w, config, variant=None):
        super().gguf_params(w, config, variant)
        # conversion/olmo.py OlmoModel.set_gguf_parameters
        w.add_layer_norm_eps(1e-5)
        if config.clip_qkv is not None and self._write_clamp:
            w.add_clamp_kqv(config.clip_qkv)


FAMILY = Olmo()
