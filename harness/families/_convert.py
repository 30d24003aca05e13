"""The converter's arithmetic several families share (``conversion/llama.py``:
``LlamaModel.permute``, ``generate_extra_tensors``), and its inverse for
``--gguf``: the Q/K row permutation of llama-style RoPE, llama3 RoPE's
``rope_freqs`` factors. Its own module so the GGUF export and import steps
(``_gguf_export.py``, ``_gguf_import.py``) and the families use them without
importing each other."""

from __future__ import annotations

import math

import numpy as np

from ..errors import UsageError


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """conversion/llama.py LlamaModel.permute: rows (h, j, i) -> (h, i, j)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_heads(a: np.ndarray) -> np.ndarray:
    """The inverse on activations ``[..., heads, D]``: channel 2i+j -> j*D/2+i."""
    d = a.shape[-1]
    return a.reshape(*a.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(a.shape)


def per_head_qkv_to_blocks(data: np.ndarray, n_head: int) -> np.ndarray:
    """The converters' "Map bloom-style qkv_linear to gpt-style qkv_linear"
    (conversion/bloom.py ``BloomModel.modify_tensors``, conversion/gptneox.py
    ``GPTNeoXModel.modify_tensors``): a fused QKV whose rows (or bias entries) run
    per head ``[h0: q k v][h1: q k v]...`` becomes ``[Q; K; V]``. Layout only."""
    n = data.shape[0]
    d = n // n_head // 3
    blocks = data.reshape(n_head, 3, d, *data.shape[1:])
    return np.concatenate([blocks[:, j].reshape(n_head * d, *data.shape[1:]) for j in range(3)], axis=0)


def per_head_qkv_split(w: np.ndarray, n_head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, k, v)`` rows of a per-head interleaved fused QKV (HF bloom ``_reshape``:
    ``view(..., n_head, 3, head_dim)``; HF GPTNeoX: ``view(..., -1, 3 * head_size)
    .chunk(3, -1)``), each ``[n_head * head_dim, ...]``."""
    q, k, v = np.split(per_head_qkv_to_blocks(w, n_head), 3, axis=0)
    return q, k, v


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


# LongRoPE's two factor sets travel as global tensors, not keys (conversion/phi.py
# Phi3MiniModel.generate_extra_tensors, conversion/minicpm.py MiniCPM3Model's; read by
# phi3.cpp / minicpm3.cpp as model.rope_factors_long / _short): phi3, phimoe, minicpm3.
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def longrope_factor_tensors(rope_parameters: dict):
    """The two factor tensors the converter writes for a LongRoPE config (none otherwise)."""
    if rope_parameters.get("long_factor"):
        yield LONGROPE_TENSORS[0], np.asarray(rope_parameters["long_factor"], dtype=np.float32)
        yield LONGROPE_TENSORS[1], np.asarray(rope_parameters["short_factor"], dtype=np.float32)


def without_longrope_tensors(tensors: dict) -> dict:
    """A file's tensors less the factor sets: hyper-parameters, read by config_from_gguf."""
    return {k: v for k, v in tensors.items() if k not in LONGROPE_TENSORS}


def longrope_factors_of(tensors) -> dict | None:
    """``long_factor`` / ``short_factor`` as HF's rope_parameters hold them (float32
    values, as the file stores them), or None where the file has no factor tensors."""
    if LONGROPE_TENSORS[0] not in tensors:
        return None
    long_f, short_f = (np.asarray(tensors[n](), dtype=np.float64).reshape(-1) for n in LONGROPE_TENSORS)
    return {"long_factor": [float(np.float32(x)) for x in long_f],
            "short_factor": [float(np.float32(x)) for x in short_f]}
