"""Rotary position embedding: the frequency table and the rotation.

The frequency table mirrors HF ``transformers.modeling_rope_utils``
(``_compute_default_rope_parameters``, ``_compute_linear_scaling_rope_parameters``,
``_compute_llama3_parameters``, ``_compute_yarn_parameters``) but is computed in
float64: the oracle must not inherit float32 rounding from its reference.

The rotation has the two layouts the spec names: ``neox`` (rotate-half, HF
``rotate_half``; llama.cpp ``LLAMA_ROPE_TYPE_NEOX``) and ``interleaved`` (GPT-J
pairs ``(2i, 2i+1)``; llama.cpp ``LLAMA_ROPE_TYPE_NORM``; spec
``apply_rope_interleaved``). Only the leading ``rotary_dim`` channels of a head
rotate (partial rotary); the rest pass through untouched.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from .config import ConfigError, RopeSpec

ROPE_KINDS = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
LONGROPE_SETS = ("short", "long")


def inverse_frequencies(kind: str, theta: float, rotary_dim: int, params: dict | None = None) -> tuple[np.ndarray, float]:
    """``(inv_freq[rotary_dim // 2], attention_factor)`` for one RoPE scaling kind.

    ``longrope`` returns the plain theta bands and its attention factor: the factor
    set divides them in the rotation (``RopeSpec.freq_factors``; ``make_rope``)."""
    params = dict(params or {})
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    base_inv = 1.0 / (float(theta) ** exponents)
    if kind == "default":
        return base_inv, 1.0
    if kind == "linear":
        return base_inv / float(params["factor"]), 1.0
    if kind == "llama3":
        # HF _compute_llama3_parameters: low wavelengths untouched, high ones divided
        # by `factor`, a smooth ramp between.
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / base_inv
        scaled = np.where(wavelen > old / low, base_inv / factor, base_inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(base_inv, float(theta), rotary_dim, params)
    if kind == "longrope":
        return base_inv, longrope_attention_factor(params)
    if kind == "proportional":
        # HF _compute_proportional_rope_parameters (gemma4's full layers): the bands span the
        # WHOLE head (exponent 2i / head_dim, ``rotary_dim`` here is the head), the first
        # int(partial_rotary_factor * head_dim // 2) pairs turn, the rest have frequency 0 --
        # rotate-half pairs (i, i + head_dim / 2), NOT the leading partial-rotary channels;
        # all divided by ``factor``. llama.cpp reaches the same with n_rot = head_dim and
        # rope_freqs 1e30 on the still pairs (conversion/gemma.py Gemma4Model.generate_extra_tensors).
        turned = int(float(params.get("partial_rotary_factor", 1.0)) * rotary_dim // 2)
        inv = base_inv.copy()
        inv[turned:] = 0.0
        return inv / float(params.get("factor", 1.0) or 1.0), 1.0
    raise ConfigError(f"unknown RoPE scaling {kind!r}; valid: {', '.join(ROPE_KINDS)}")


def _yarn(base_inv: np.ndarray, theta: float, dim: int, p: dict) -> tuple[np.ndarray, float]:
    # HF _compute_yarn_parameters, step by step.
    factor = p.get("factor")
    if factor is None:
        factor = p["max_position_embeddings"] / p["original_max_position_embeddings"]
    factor = float(factor)
    orig = float(p["original_max_position_embeddings"])

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = get_mscale(factor, p["mscale"]) / get_mscale(factor, p["mscale_all_dim"])
        else:
            attention_factor = get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32.0
    beta_slow = p.get("beta_slow") or 1.0

    def correction_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF linear_ramp_factor: prevent a singularity
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (base_inv / factor) * (1 - extrapolation) + base_inv * extrapolation
    return inv, float(attention_factor)


def longrope_attention_factor(p: dict) -> float:
    """HF ``_compute_longrope_parameters``: the given ``attention_factor``, else
    ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` for a factor > 1
    (``factor`` defaults to ``max_position_embeddings / original_max_position_embeddings``,
    phi3's convention), else 1."""
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    orig = float(p["original_max_position_embeddings"])
    factor = p.get("factor")
    factor = float(p["max_position_embeddings"]) / orig if factor is None else float(factor)
    return 1.0 if factor <= 1.0 else math.sqrt(1.0 + math.log(factor) / math.log(orig))


def make_rope(kind: str, theta: float, rotary_dim: int, layout: str = "neox", params: dict | None = None) -> RopeSpec:
    """One layer's RoPE. ``longrope`` reads ``params["which"]`` (``short``, the default,
    or ``long``): the factor set the rotation divides the bands by (HF
    ``longrope_frequency_update`` picks ``long`` for a sequence longer than
    ``original_max_position_embeddings``; llama.cpp ``get_rope_factors`` for a context
    longer than it -- the family says which its case runs)."""
    inv, factor = inverse_frequencies(kind, theta, rotary_dim, params)
    ff = None
    if kind == "longrope":
        p = params or {}
        which = p.get("which", "short")
        if which not in LONGROPE_SETS:
            raise ConfigError(f"unknown LongRoPE factor set {which!r}; valid: {', '.join(LONGROPE_SETS)}")
        ff = tuple(float(x) for x in p[f"{which}_factor"])
    return RopeSpec(inv_freq=tuple(float(x) for x in inv), layout=layout, attention_factor=factor, kind=kind,
                    theta=float(theta), freq_factors=ff)


def cos_sin(spec: RopeSpec, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, rotary_dim // 2]`` cos and sin in float64, with YaRN's factor folded in."""
    freq = np.asarray(spec.inv_freq, dtype=np.float64)
    if spec.freq_factors is not None:
        # ggml_rope_ext: theta_i / freq_factors[i] (LongRoPE's short / long set; HF
        # _compute_longrope_parameters: 1 / (ext_factors * base ** (2i / d)))
        freq = freq / np.asarray(spec.freq_factors, dtype=np.float64)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * freq[None, :]
    return np.cos(ang) * spec.attention_factor, np.sin(ang) * spec.attention_factor


# (backend, spec, builders) -> (cos, sin) device tables for positions [0, rows): built in
# float64 on the host and moved once, then sliced per call (a decode step must
# not re-upload its row of the table). Least recently used tables go first.
_TABLES: OrderedDict = OrderedDict()
_MAX_TABLES = 64
_MIN_ROWS = 256


def cos_sin_on(be, spec: RopeSpec, positions: np.ndarray):
    """``cos_sin(spec, positions)`` as ``be`` arrays of its compute dtype.

    Bit for bit what ``be.asarray(cos_sin(spec, positions))`` gives: each row of
    the table is the same float64 value rounded once. Contiguous positions (every
    caller's: a call's rows follow the sequence) are sliced from a per-(backend,
    spec) table that doubles as positions grow; anything else is computed afresh.
    """
    pos = np.asarray(positions, dtype=np.int64)
    n = int(pos.shape[0])
    if n == 0 or pos[0] < 0 or not np.all(np.diff(pos) == 1):
        cos, sin = cos_sin(spec, pos)
        return be.asarray(cos), be.asarray(sin)
    start, stop = int(pos[0]), int(pos[-1]) + 1
    # The functions that build the table are part of its key: code swapped in at
    # run time (a mutant of harness/mutants replacing cos_sin, or this function)
    # must never be served a table the original code built.
    key = (be, spec, cos_sin, cos_sin_on)
    hit = _TABLES.get(key)
    if hit is None or hit[0].shape[0] < stop:
        rows = max(_MIN_ROWS, stop, 2 * (hit[0].shape[0] if hit is not None else 0))
        cos, sin = cos_sin(spec, np.arange(rows, dtype=np.int64))
        hit = (be.asarray(cos), be.asarray(sin))
        _TABLES[key] = hit
        while len(_TABLES) > _MAX_TABLES:
            _TABLES.popitem(last=False)
    _TABLES.move_to_end(key)
    return hit[0][start:stop], hit[1][start:stop]


def rotate(xp, x, cos, sin, layout: str, rotary_dim: int):
    """Rotate the leading ``rotary_dim`` channels of ``x[n, heads, d]``.

    ``cos``/``sin`` are ``[n, rotary_dim // 2]`` backend arrays. One function for
    Q and K, every layer, both layouts: the layout is a parameter, not a copy.
    """
    half = rotary_dim // 2
    c = cos[:, None, :]
    s = sin[:, None, :]
    if layout == "neox":
        # HF's form (``q * cos + rotate_half(q) * sin``, full-width tables): per element
        # the same products summed in the same order as ``[x1 c - x2 s, x2 c + x1 s]``
        # (``a - b`` is ``a + (-b)`` exactly), in fewer passes over strided halves
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
        c2, s2 = xp.concat([c, c], axis=-1), xp.concat([s, s], axis=-1)
        xr = x if rotary_dim == x.shape[-1] else x[..., :rotary_dim]
        rot = xr * c2 + xp.concat([-x2, x1], axis=-1) * s2
    else:
        xe, xo = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        pairs = xp.stack([xe * c - xo * s, xo * c + xe * s], axis=-1)
        rot = xp.reshape(pairs, (*x.shape[:-1], rotary_dim))
    if rotary_dim == x.shape[-1]:
        return rot
    return xp.concat([rot, x[..., rotary_dim:]], axis=-1)
