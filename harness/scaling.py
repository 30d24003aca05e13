"""Tolerances that scale with what the arithmetic can do (issue 13): a bound
calibrated on a 16-token model must not raise a false alarm at 2048 tokens.

The part of a float32 disagreement that grows with the SIZE of a case is the
RoPE angle. llama.cpp builds each pair's angle in float32 by repeated
multiplication (ggml-cpu ops.cpp ``ggml_rope_cache_init``: ``theta = pos``,
then ``theta *= theta_scale`` once per pair, ``theta_scale = powf(base,
-2/n_dims)``), so the angle of pair ``i`` carries ``i`` roundings of the
multiplication AND ``i`` times the rounding of ``theta_scale`` itself -- a
systematic relative error up to about ``2 i u`` (u the unit roundoff), fixed by
how ``powf`` rounded that one number for this head_dim and base. HF at float32
takes ``cos(pos.float() * inv_freq.float())`` (``*RotaryEmbedding.forward``):
a few roundings, none growing with ``i``. So the angle of pair ``i`` at
position ``p`` errs by up to about ``2 u (1 + i) p inv_freq_i``: it grows with
the position AND with the pair. A rotated value ``x`` then errs by ``|x|``
times that, and the error rides into the scores, the probabilities and
everything after them in the layer.

So a probe downstream of a RoPE (``rope_affected``) gets, on top of its
dtype's base bound (fixtures/tolerance.toml, where the coefficients live):

  nmse  += rope_nmse * eps^2 * mean_{p, i} (p * inv_freq_i * (1 + i))^2
  atol  += rope_atol * eps * max_{p, i} (p * inv_freq_i * (1 + i)) * max|ref|

with ``eps`` the unit roundoff of the precision the reference computes its
angles in (float32 for llama.cpp and for HF below float64; float64 for HF at
float64, references/hf/float64.py); ``rope_nmse = 8`` is the worst case of the
systematic error above for a ``powf`` up to one ulp off (``theta_scale``'s
relative error up to 1.7 u, so pair ``i`` errs up to 2.7 u i: 2.7^2 = 7.3),
whatever libm the machine has; per element the same worst case is 2.7 u (1 + i)
p inv_freq_i |x|, under ``rope_atol = 4`` times the max term. And ``atol`` itself is absolute at unit scale: ``max_abs <= atol *
max(1, max|ref|)``, since real checkpoints' activations are not the O(1)
values of a seeded tiny model.

Measured (scripts/bench_real_size.py, 2026-12-01), impl vs llama.cpp q_rope at
2048 tokens, theta 1e4: head_dim 64 NMSE 1.34e-10, head_dim 128 2.31e-9 --
0.38x and 7.4x the previous term ``eps^2 * mean (p * inv_freq)^2``, which
had no ``(1 + i)`` and so raised a false alarm at head_dim 128 (bound 1.34e-9).
Simulating ggml's recurrence against exact angles (head_dim 32..256, 256 and
2048 tokens) gives 0.04-0.77 x ``eps^2 * mean (p * inv_freq * (1 + i))^2``,
and the head_dim 128 measurement is 7.4 / 28 = 0.26 of it
(tests/test_real_size.py simulates the recurrence with ``theta_scale`` and its
two float32 neighbours at head_dim 32..256).

The oracle rule's float32 floor grows with the case too, with the reduction
width in front of the probe (``floor_for`` below; measured at hidden 256 in
docs/measurements/2026-12-02-float32-floor.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from contract.recurrent import RecurrentConfig

EPS = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


@dataclass(frozen=True)
class RopeSize:
    """How far the RoPE angles of one layer reach in one case."""
    mean_sq: float  # mean over positions and rotated pairs of (pos * inv_freq * (1 + pair))^2
    max_weighted: float  # max over positions and pairs of pos * inv_freq * (1 + pair)


def rope_size(lc, n_tokens: int) -> RopeSize | None:
    """The RoPE reach of layer description ``lc`` over positions ``0 .. n_tokens-1``
    (None: a layer without RoPE)."""
    rope = getattr(lc, "rope", None)
    if rope is None or n_tokens < 1:
        return None
    f = np.abs(np.asarray(rope.inv_freq, dtype=np.float64))
    # pair i's angle error grows with i (the recurrence above): weight i by 1 + i
    w = f * (1.0 + np.arange(f.size))
    # mean over p of p^2 is (n-1)(2n-1)/6; the angles are p * f
    mean_p2 = (n_tokens - 1) * (2 * n_tokens - 1) / 6.0
    mean_sq = float(mean_p2 * np.mean(w * w))
    max_weighted = float((n_tokens - 1) * np.max(w))
    return RopeSize(mean_sq, max_weighted)


def reduction_width(lc) -> int | None:
    """The widest reduction in front of every probe of layer description ``lc``: its
    hidden row, which the input norm's mean and each input projection (q / k / v,
    MLA's down projections, a recurrent layer's in-projection) sum over. None where
    the description has no hidden width."""
    hid = getattr(lc, "hidden_size", None)
    return int(hid) if isinstance(hid, int) and hid > 0 else None


# the probes a recurrent layer's output RMS norm feeds, inside the layer: what enters
# out_proj and what leaves it (resid_mid adds the residual, which dilutes the norm's error)
NORMED_OUTPUT_PROBES = ("attn_branch", "attn_out")


def output_norm_amplification(lc, probes: dict, layer: int) -> float:
    """How much a recurrent layer's output RMS norm multiplies a float32 error of its
    input, in NMSE: ``mean(ms) * mean(1 / (ms + eps))`` over the norm's groups (one
    a token and value head for a gated delta net; HF ``Qwen3NextRMSNormGated``,
    qwen35.cpp ``build_norm_gated``), ``ms`` each group's mean square in the float64
    run ``probes`` (the oracle's ``rec_out``, times ``silu(rec_z)`` where the gate
    comes first: Mamba-2). Why: rounding leaves about the same ABSOLUTE error in
    every group of the scan's output, and the norm scales each group to unit RMS, so
    a group the scan made small by cancellation (q . S near 0) has its relative
    error multiplied by mean(ms) / ms -- and the layer's NMSE after the norm is the
    mean of those. A float32 candidate is then off by the floor times this where
    the reference rounded that group luckily (qwen3_5_text, 1 head, 3 tokens: one
    group at 1/50 of the RMS, impl's relative error there 1.2e-10 against HF's
    3.6e-12, attn_branch 11x HF's distance to the float64 oracle; the norm's
    amplification there 28, the row then at 0.22 of its bound). 1 where the layer has no output norm or nothing to measure."""

    if not isinstance(lc, RecurrentConfig) or not lc.norm_groups:
        return 1.0
    y = probes.get(f"L{layer}.rec_out")
    if y is None:
        return 1.0
    y = np.asarray(y, dtype=np.float64)
    if lc.gate_order == "gate_then_norm":
        z = probes.get(f"L{layer}.rec_z")
        if z is None or np.shape(z) != y.shape:
            return 1.0
        z = np.asarray(z, dtype=np.float64)
        y = y * z / (1.0 + np.exp(-z))
    if y.size % lc.width:
        return 1.0
    ms = np.mean(np.reshape(y, (-1, lc.norm_groups, lc.width // lc.norm_groups)) ** 2, axis=-1).ravel()
    ms = ms[np.isfinite(ms)]
    if not ms.size or not np.any(ms > 0):
        return 1.0
    return max(1.0, float(np.mean(ms) * np.mean(1.0 / (ms + lc.out_norm_eps))))


# the probes a softmax's float32 rounding reaches, inside the layer: the probabilities and
# what they are multiplied into (resid_mid adds the residual, which dilutes it)
SOFTMAX_PROBES = ("attn_probs", "attn_heads", "attn_branch", "attn_out")


def score_magnitude(probes: dict, layer: int) -> float | None:
    """What float32 rounding of an attention layer's scores does to its probabilities,
    in units of u^2 (float32's unit roundoff squared), from the float64 run's
    ``q_rope``, ``k_rope`` and ``attn_probs`` of ``layer``::

        M = sum_{t,j} p_tj^2 (1 - 2 p_tj + sum_i p_ti^2) c^2 |q_t|^2 |k_j|^2 / sum_{t,j} p_tj^2

    ``c`` the scale between the dot products and the scores, fitted to the run (the
    centred log-probabilities of every row against its centred ``q . k``: 1 / sqrt(d)
    in most families, 1 in gemma4, mscale^2 / sqrt(d) in MLA), so nothing here reads
    a family's formula. None where the probes are absent or their shapes do not meet
    (an MLA layer in absorbed form has no ``k_rope``).

    Why: a float32 score ``c q . k_j`` errs by about u |c q| |k_j| (its own sum's
    rounding, and the rounding q and k carry into it), and the softmax turns score
    errors of variance sigma^2 into ``delta p_j = p_j (delta s_j - sum_i p_i delta s_i)``,
    of expected square ``p_j^2 sigma^2 (1 - 2 p_j + sum_i p_i^2)`` -- nothing where
    one key takes all, the most where many share. So a sound float32 attention's
    NMSE at ``attn_probs`` is about u^2 M. Measured (torch float32 against HF's
    float64 run, prefill, 16 tokens): impl's NMSE / (u^2 M) 0.22-2.5 and HF's
    0.2-1.6 over llama, qwen3, gemma2/3/4, gpt_oss, olmo2, deepseek_v3, llama4, phi3,
    cohere2, on random and realistic weights, while M itself spans 5 (llama, random)
    to 4180 (gemma4's global layer, realistic). The float32 floor (1e-13 = 28 u^2)
    was set where M is 5-14; gemma4's scale of 1 over normalised q and k gives M ~
    100 on random weights, where a 5-token fuzz case had HF 1.5e-13 from the oracle
    and impl 6.2e-13 (M 109: 0.39 and 1.6 u^2 M), a false alarm of the plain floor."""
    p, q, k = (probes.get(f"L{layer}.{n}") for n in ("attn_probs", "q_rope", "k_rope"))
    if p is None or q is None or k is None or np.ndim(p) != 4 or np.ndim(q) != 4 or np.ndim(k) != 4:
        return None
    p, q, k = (np.asarray(x, dtype=np.float64) for x in (p, q, k))
    s, h, t, tk = p.shape
    if q.shape[:3] != (s, t, h) or k.shape[:2] != (s, tk) or k.shape[3] != q.shape[3] or h % k.shape[2]:
        return None
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(q)) and np.all(np.isfinite(k))):
        return None
    k = np.repeat(k, h // k.shape[2], axis=2)  # a query head reads its group's key head
    qk = np.einsum("sthd,sjhd->shtj", q, k)
    valid = p > 0  # a masked key is exactly 0 in the float64 run
    n = valid.sum(axis=-1, keepdims=True)
    rows = valid & (n >= 2)  # a row of one key has no spread to fit the scale on

    def centred(x):
        return (x - np.sum(x * rows, axis=-1, keepdims=True) / np.maximum(n, 1)) * rows

    den = float(np.sum(centred(qk) ** 2))
    if not den > 0:
        return None
    c2 = float(np.sum(centred(np.log(np.where(valid, p, 1.0))) ** 2)) / den
    q2 = np.sum(q * q, axis=-1).transpose(0, 2, 1)[..., None]  # [S, H, T, 1]
    k2 = np.sum(k * k, axis=-1).transpose(0, 2, 1)[:, :, None, :]  # [S, H, 1, Tk]
    p2 = np.sum(p * p, axis=-1, keepdims=True)
    total = float(np.sum(p2))
    if not total > 0:
        return None
    return float(np.sum(p * p * (1.0 - 2.0 * p + p2) * c2 * q2 * k2)) / total


def residual_floor_scale(amp: float, probes: dict, layer: int) -> float:
    """The float32 floor's scale at ``resid_mid`` behind a recurrent layer's output norm
    whose amplification at ``attn_out`` is ``amp`` (``output_norm_amplification``): the
    absolute error the norm lets into ``attn_out`` -- floor x amp x |attn_out|^2 -- is
    added to the residual unchanged, so at ``resid_mid`` it is that over |resid_mid|^2,
    from the float64 run ``probes``. The residual dilutes it, but not to nothing: the
    qwen3_5_text fuzz case (1 head, 3 tokens; amplification 28) sat at 1.02 of the plain
    floor at L0 resid_mid on a CPU whose BLAS rounds otherwise than the one it was first
    measured on (0.22 there), a false alarm. 1 where nothing is amplified."""
    if amp <= 1.0:
        return 1.0
    share = residual_share(probes, layer)
    return 1.0 if share is None else max(1.0, amp * share)


def residual_share(probes: dict, layer: int) -> float | None:
    """``|attn_out|^2 / |resid_mid|^2`` of ``layer`` in the float64 run ``probes``: what an
    absolute error at ``attn_out`` is, in NMSE, once the residual is added (None:
    nothing to measure)."""
    out, mid = probes.get(f"L{layer}.attn_out"), probes.get(f"L{layer}.resid_mid")
    if out is None or mid is None:
        return None
    e_mid = float(np.sum(np.asarray(mid, dtype=np.float64) ** 2))
    if not e_mid > 0:
        return None
    return float(np.sum(np.asarray(out, dtype=np.float64) ** 2)) / e_mid


def floor_for(tol: dict, width: int | None) -> float | None:
    """The oracle rule's ``nmse_floor`` for a probe behind a reduction of ``width``
    terms: ``nmse_floor * max(1, width / floor_width)`` where the table names a
    ``floor_width`` (float32's), the table's floor elsewhere (None: no floor).

    Why it grows: a float32 dot product of n terms summed one after another
    rounds to ~n u^2 / 10 relative variance (tests/test_scaling_floor.py simulates
    it at n = 64 .. 4096), and a sound engine may sum that way where the
    reference's library blocks the sum (impl's NumPy backend: OpenBLAS sgemm, 1.5x
    HF's MKL at hidden 256). The floor covers a candidate's rounding where the
    reference rounded luckily; calibrated at ``floor_width`` terms, it keeps the
    same headroom over that sum at every width only if it grows with n."""
    floor = tol.get("nmse_floor")
    if floor is None or "floor_width" not in tol or not width:
        return floor
    return floor * max(1.0, width / tol["floor_width"])


def state_width(probe: str, width: int | None, rows: int | None) -> int | None:
    """The floor width of the recurrent state a scan carries (``state_rec``): the rows
    it has carried, where more than the layer's ``width``. The conv state
    (``state_conv``) is a copy of the last rows' inputs, no sum: the layer's width.

    Why: a state carried row after row is a running sum over every row it remembers,
    each step rounded -- a sequential sum of n terms, ~n u^2 / 10 relative variance
    (tests/test_scaling_floor.py) -- while a reference may compute it as one blocked
    reduction (HF's Mamba-2 chunked SSD, an einsum over the chunk's rows: ~log n). With
    trained weights some heads remember every row (decay near 1; ``--weights
    trained``), and in such a head a sound sequential float32 state was 72x HF's lucky
    7.95e-15 (mamba2, trained, float32, 256 tokens in calls of 128: head 3 at 5.7e-13,
    over the fixed floor's 4e-13 against HF's cached path and against llama.cpp alone;
    docs/measurements/2026-12-07-float32-llamacpp-alone.md). ``rows``: the case's
    rows per sequence, the longest chain any call's state ends."""
    if probe.rsplit(".", 1)[-1] != "state_rec" or not rows:
        return width
    return max(width or 0, int(rows))


def scaled(tol: dict, rope: RopeSize | None, angle_dtype: str, ref_scale: float, width: int | None = None) -> dict:
    """``tol`` (a dtype's table entry) made effective for one comparison: the RoPE
    terms where the probe is downstream of a RoPE (``rope`` given), ``atol`` at the
    reference's scale, the oracle rule's floor at the reduction ``width`` in front
    of the probe (``floor_for``)."""
    out = dict(tol)
    if "nmse_floor" in tol:
        out["nmse_floor"] = floor_for(tol, width)
    eps = EPS.get(angle_dtype, EPS["float32"])
    scale = max(1.0, float(ref_scale)) if math.isfinite(ref_scale) else 1.0
    rope_atol = 0.0
    if rope is not None:
        out["nmse"] = tol["nmse"] + tol.get("rope_nmse", 0.0) * eps * eps * rope.mean_sq
        rope_atol = tol.get("rope_atol", 0.0) * eps * rope.max_weighted
    out["atol"] = tol["atol"] * scale + rope_atol * (ref_scale if math.isfinite(ref_scale) else 0.0)
    return out
