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

import math
import re

import numpy as np

from ..errors import UsageError
from .base import LlamaLike


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """conversion/llama.py LlamaModel.permute: rows (h, j, i) -> (h, i, j)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_heads(a: np.ndarray) -> np.ndarray:
    """The inverse on activations ``[..., heads, D]``: channel 2i+j -> j*D/2+i."""
    d = a.shape[-1]
    return a.reshape(*a.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(a.shape)


def llama3_rope_factors(config) -> np.ndarray | None:
    """conversion/llama.py ``LlamaModel.generate_extra_tensors``: llama3 RoPE scaling
    reaches llama.cpp as a ``rope_freqs`` tensor of per-pair frequency divisors
    (llama.cpp: ``model.get_rope_factors`` -> ``ggml_rope_ext``'s freq_factors)."""
    rp = dict(config.rope_parameters or {})
    rp = rp.get("full_attention", rp)
    if str(rp.get("rope_type", "")).lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rp.get("factor", 8.0)
    low, high = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def llama3_from_factors(meta, factors: np.ndarray, rope: dict, head_dim: int) -> dict:
    """The HF ``llama3`` RoPE parameters a ``rope_freqs`` tensor came from (the
    inverse of ``llama3_rope_factors``). HF's formula depends on
    ``original_max_position_embeddings``, ``low_freq_factor`` and
    ``high_freq_factor`` only through their ratios, so ``low_freq_factor = 1``
    and the rest follow from the smoothly scaled pairs (their ``1 / f`` is
    linear in the pair's frequency); the result is checked to give the file's
    factors back, else the tensor is refused."""
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    theta = float(rope["rope_theta"])
    if rope.get("rope_type") != "default":
        meta.refuse("rope.scaling.type", rope.get("rope_type"), "rope_freqs.weight on top of a RoPE scaling")
    if f.size != head_dim // 2:
        raise UsageError(f"--gguf {meta.path}: rope_freqs.weight has {f.size} factors; head_dim {head_dim} "
                         f"rotates {head_dim // 2} pairs")
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    factor = float(f.max())
    if factor <= 1.0 or not np.all(f >= 1.0 - 1e-6):
        raise UsageError(f"--gguf {meta.path}: rope_freqs.weight {f[:4].tolist()}... is not llama3 scaling "
                         "(factors >= 1, the largest the scale)")
    tol = 1e-5 * factor
    low_i = np.flatnonzero(f > factor - tol)
    high_i = np.flatnonzero(f < 1 + tol)
    mid = np.flatnonzero((f >= 1 + tol) & (f <= factor - tol))
    if mid.size >= 2:
        # smooth = (1/f - 1/factor) / (1 - 1/factor) = a / wavelen - b, a = old / (high - low), b = low / (high - low)
        s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
        a, nb = np.polyfit(1 / wavelen[mid], s, 1)
        b = -nb
        low, high, old = 1.0, 1.0 + 1.0 / b, a / b
    else:
        # no (or one) pair on the ramp: any ramp between the last unscaled and the
        # first fully scaled wavelength gives the same factors
        w1 = wavelen[high_i].max() if high_i.size else wavelen.min() / 2
        w2 = wavelen[low_i].min() if low_i.size else wavelen.max() * 2
        if mid.size == 1:
            w1 = w2 = wavelen[mid[0]]  # solved below from the one ramp point
        old = float(np.sqrt(w1 * w2)) if mid.size == 0 else float(w2)
        low = 1.0
        high = old / float(np.sqrt(w1 * old)) if mid.size == 0 else None
        if mid.size == 1:
            s = (1 / f[mid[0]] - 1 / factor) / (1 - 1 / factor)
            # old/wavelen - low = s (high - low) with old = wavelen * 2: 2 - 1 = s (high - 1)
            old = 2 * float(wavelen[mid[0]])
            high = 1.0 + 1.0 / s
    out = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": float(low),
           "high_freq_factor": float(high), "original_max_position_embeddings": float(old)}
    back = llama3_rope_factors(type("C", (), {"rope_parameters": out, "head_dim": head_dim})())
    if back is None or not np.allclose(back, f, rtol=1e-5, atol=0):
        raise UsageError(f"--gguf {meta.path}: rope_freqs.weight does not follow llama3's scaling formula "
                         "(conversion/llama.py generate_extra_tensors); no HF RoPE reproduces it")
    return out


class PermutedQK(LlamaLike):
    """A llama-shaped family whose converter is ``LlamaModel``'s (or a subclass's):
    the GGUF holds ``permute_rows``'d Q/K rows and biases, and the capture undoes
    the permutation on llama.cpp's Q and K (see the module docstring)."""

    permute_qk = True  # what the converter does; tests break it to show the capture notices
    converter_rope_freqs = True  # LlamaModel.generate_extra_tensors

    def gguf_transform(self, name, data, config):
        # conversion/llama.py LlamaModel.modify_tensors (undo_permute): q rows by
        # n_head, k rows by n_kv_head, weights and biases alike
        if self.permute_qk:
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


# The wo_scale variant's per-tensor scale (see the module docstring).
WO_SCALE = 0.37
_WO = re.compile(r"blk\.\d+\.attn_output\.weight")


class LlamaFamily(Llama):
    """The llama family with its named variants (``Llama`` itself, which olmo and
    smollm3 extend, has none)."""

    variants = ("plain", "wo_scale")
    # the wo_scale export writes the companion (a test switches it off to show
    # llama.cpp then computes with W / s alone)
    write_wo_scale = True

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

    def gguf_tensors(self, model, config, variant=None):
        for name, data in super().gguf_tensors(model, config, variant):
            if variant == "wo_scale" and _WO.fullmatch(name):
                # a per-tensor-scaled checkpoint: W / s and its {1} companion s, the
                # tensor llama-model.cpp's generic pass loads as layer.wo_s
                yield name, data / np.float32(WO_SCALE)
                if self.write_wo_scale:
                    yield name.removesuffix(".weight") + ".scale", np.array([WO_SCALE], dtype=np.float32)
            else:
                yield name, data


FAMILY = LlamaFamily()
