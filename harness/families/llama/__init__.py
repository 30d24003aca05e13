"""llama: the plain decoder (HF ``LlamaForCausalLM``; llama.cpp ``src/models/llama.cpp``).

GQA, neox RoPE, RMS input norm, no biases by default (``attention_bias`` turns
all four on, HF ``LlamaAttention.__init__``).

llama.cpp runs llama with ``LLAMA_ROPE_TYPE_NORM`` (interleaved pairs), so the
converter permutes the rows of ``q_proj`` / ``k_proj`` (and their biases) per
head (``conversion/llama.py``, ``LlamaModel.permute``, applied in
``modify_tensors`` when ``undo_permute``): HF channel ``j * D/2 + i`` becomes
llama.cpp channel ``2i + j``. The interleaved rotation of the permuted
channels is the neox rotation of the original ones. The capture undoes the
permutation on Q and K so they compare channel for channel.

Variants (``--variant``; the first is the default):
- ``plain``: the checkpoint as HF holds it.
- ``wo_scale``: the ``wo`` SCALE companion (spec ``project_attn_rows``:
  ``build_lora_mm(wo, cur, wo_s)``, THEN ``wo_b``). llama.cpp creates an optional
  ``blk.N.attn_output.scale`` of shape {1} for every arch (src/llama-model.cpp,
  the generic pass after ``load_arch_tensors``: the NVFP4 "scale2" companion)
  and llama.cpp's llama graph passes it to ``build_attn``
  (src/models/llama.cpp), which multiplies it onto ``wo``'s product and then
  adds ``wo_b`` (src/llama-graph.cpp). A checkpoint stored with a per-tensor
  weight scale represents ``W = W' * s``: the GGUF stores ``attn_output.weight =
  W / s`` and ``attn_output.scale = [s]``, impl gets ``wo = W / s`` and
  ``LayerConfig.o_scale = s``, HF keeps ``W`` -- the same function three ways, so
  the variant checks that impl and llama.cpp apply the companion, and (with
  ``--set attention_bias=true``) that they apply it BEFORE the bias: the bias
  scaled by ``s`` would differ by ``b * (s - 1)``. ``s = WO_SCALE = 0.37``: not a
  power of two, so the float32 round trip ``(W / s) * s`` is not exact (as in a
  real scaled file) and the comparison shows that rounding stays inside the
  float32 tolerance (measured: attn_out nmse ~1e-13 on every side). The
  subclasses of ``Llama`` (olmo, smollm3) do not inherit the variants.
"""

import re

import numpy as np

from .._convert import llama3_from_factors, llama3_rope_factors, permute_rows, unpermute_heads  # noqa: F401
from ..base import LlamaLike


class PermutedQK(LlamaLike):
    """A llama-shaped family whose converter is ``LlamaModel``'s (or a subclass's):
    the GGUF holds ``permute_rows``'d Q/K rows and biases, and the capture undoes
    the permutation on llama.cpp's Q and K (see the module docstring)."""

    _permute_qk = True  # what the converter does; tests break it to show the capture notices
    converter_rope_freqs = True  # LlamaModel.generate_extra_tensors

    def gguf_transform(self, name, data, config):
        # conversion/llama.py LlamaModel.modify_tensors (undo_permute): q rows by
        # n_head, k rows by n_kv_head, weights and biases alike
        if self._permute_qk:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                return permute_rows(data, config.num_attention_heads)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                return permute_rows(data, config.num_key_value_heads)
        return data

    def lc_canonical(self, probe, arr, lc, config):
        if probe in ("q", "k", "q_rope", "k_rope"):
            return unpermute_heads(arr)
        return super().lc_canonical(probe, arr, lc, config)


class Llama(PermutedQK):
    name = "llama"
    hf_model_type = "llama"
    description = "plain GQA decoder, neox RoPE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    gguf_arch = "llama"
    layer_major = True  # LlamaDecoderLayer: its own cache layer only (tests/test_layer_major.py)


# The wo_scale variant's per-tensor scale (see the module docstring).
WO_SCALE = 0.37
_WO = re.compile(r"blk\.\d+\.attn_output\.weight")


class LlamaFamily(Llama):
    """The llama family with its named variants (``Llama`` itself, which olmo and
    smollm3 extend, has none)."""

    variants = ("plain", "wo_scale")
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "bias", "rope", "theta"), "rope": ("default", "linear", "yarn", "llama3")}
    # the wo_scale export writes the companion (a test switches it off to show
    # llama.cpp then computes with W / s alone)
    _write_wo_scale = True

    def layer_configs(self, config, variant=None):
        lcs = super().layer_configs(config, variant)
        if variant == "wo_scale":
            # spec project_attn_rows: `build_lora_mm(wo, cur, wo_s)`, then `wo_b`
            lcs = [lc.replace(o_scale=WO_SCALE) for lc in lcs]
        return lcs

    def variant_weights(self, weights, config, i, variant):
        if variant == "wo_scale":
            weights = {**weights, "wo": weights["wo"] / WO_SCALE}  # W = (W / s) * s
        return weights

    def gguf_hf_tensor(self, name, data, config, variant, tmap):
        for gname, out in super().gguf_hf_tensor(name, data, config, variant, tmap):
            if variant == "wo_scale" and _WO.fullmatch(gname):
                # a per-tensor-scaled checkpoint: W / s and its {1} companion s, the
                # tensor llama-model.cpp's generic pass loads as layer.wo_s
                yield gname, out / np.float32(WO_SCALE)
                if self._write_wo_scale:
                    yield gname.removesuffix(".weight") + ".scale", np.array([WO_SCALE], dtype=np.float32)
            else:
                yield gname, out


FAMILY = LlamaFamily()
