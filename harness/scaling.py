"""Tolerances that scale with what the arithmetic can do (issue 13): a bound
calibrated on a 16-token model must not raise a false alarm at 2048 tokens.

The part of a float32 disagreement that grows with the SIZE of a case is the
RoPE angle: llama.cpp builds each pair's angle in float32 by repeated
multiplication (ggml-cpu ops.cpp ``ggml_rope_cache_init``: ``theta *=
theta_scale`` once per pair, from ``theta = pos``) and HF at float32 takes
``cos(pos.float() * inv_freq.float())`` (``*RotaryEmbedding.forward``), so the
angle of pair ``i`` at position ``p`` carries an absolute error of about
``eps * p * inv_freq_i * sqrt(1 + i)``: it grows with the position. A rotated
value ``x`` then errs by about ``|x|`` times that angle error, and the error
rides into the scores, the probabilities and everything after them in the layer.

So a probe downstream of a RoPE (``rope_affected``) gets, on top of its
dtype's base bound (fixtures/tolerance.toml, where the coefficients live):

  nmse  += rope_nmse * eps^2 * mean_{p, i} (p * inv_freq_i)^2
  atol  += rope_atol * eps * max_{p, i} (p * inv_freq_i * sqrt(1 + i)) * max|ref|

with ``eps`` the unit roundoff of the precision the reference computes its
angles in (float32 for llama.cpp and for HF below float64; float64 for HF at
float64, refs/hf_float64.py). And ``atol`` itself is absolute at unit scale:
``max_abs <= atol * max(1, max|ref|)``, since real checkpoints' activations are
not the O(1) values of a seeded tiny model. Measured (scripts/bench_real_size.py):
llama, head_dim 64, theta 1e4, impl vs llama.cpp q_rope NMSE 2.15e-12 at 256
tokens and 1.34e-10 at 2048 (0.1 x the mean term above both times), max_abs
3.3e-5 / 3.1e-4 (1.0-1.2 x eps * max term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EPS = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


@dataclass(frozen=True)
class RopeSize:
    """How far the RoPE angles of one layer reach in one case."""

    mean_sq: float  # mean over positions and rotated pairs of (pos * inv_freq)^2
    max_weighted: float  # max over positions and pairs of pos * inv_freq * sqrt(1 + pair)


def rope_size(lc, n_tokens: int) -> RopeSize | None:
    """The RoPE reach of layer description ``lc`` over positions ``0 .. n_tokens-1``
    (None: a layer without RoPE)."""
    rope = getattr(lc, "rope", None)
    if rope is None or n_tokens < 1:
        return None
    f = np.abs(np.asarray(rope.inv_freq, dtype=np.float64))
    # mean over p of p^2 is (n-1)(2n-1)/6; the angles are p * f
    mean_p2 = (n_tokens - 1) * (2 * n_tokens - 1) / 6.0
    mean_sq = float(mean_p2 * np.mean(f * f))
    max_weighted = float((n_tokens - 1) * np.max(f * np.sqrt(1.0 + np.arange(f.size))))
    return RopeSize(mean_sq, max_weighted)


def scaled(tol: dict, rope: RopeSize | None, angle_dtype: str, ref_scale: float) -> dict:
    """``tol`` (a dtype's table entry) made effective for one comparison: the RoPE
    terms where the probe is downstream of a RoPE (``rope`` given), ``atol`` at the
    reference's scale."""
    out = dict(tol)
    eps = EPS.get(angle_dtype, EPS["float32"])
    scale = max(1.0, float(ref_scale)) if math.isfinite(ref_scale) else 1.0
    rope_atol = 0.0
    if rope is not None:
        out["nmse"] = tol["nmse"] + tol.get("rope_nmse", 0.0) * eps * eps * rope.mean_sq
        rope_atol = tol.get("rope_atol", 0.0) * eps * rope.max_weighted
    out["atol"] = tol["atol"] * scale + rope_atol * (ref_scale if math.isfinite(ref_scale) else 0.0)
    return out
