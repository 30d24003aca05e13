"""Per-probe metrics and the verdict under the tolerance policy.

Metrics (DESIGN.md "Comparison and tolerance"): max_abs, max_rel, mean_abs,
rmse, NMSE = sum((a-b)^2) / sum(a^2) (llama.cpp test-backend-ops'
normalisation, the reference in the denominator), cosine, the index of the
worst element (named by the probe's axes), the smallest atol that would pass
(= max_abs), finiteness. NaN or Inf never pass.
"""

from __future__ import annotations

import math

import numpy as np

from contract.probes import axes as probe_axes

METRIC_KEYS = ("max_abs", "max_rel", "mean_abs", "rmse", "nmse", "cosine", "worst", "min_atol", "finite")


CHUNK = 1 << 22  # elements per block: a real-size probe (a 1B model's attn_probs at 2048 tokens,
# 134M elements) is reduced in blocks, so the metrics' float64 temporaries stay a few
# blocks, whatever the probe's size (harness/budget.py counts them)


def _flat(x) -> np.ndarray:
    return np.reshape(np.asarray(x), -1)


def _blocks(n: int):
    for start in range(0, n, CHUNK):
        yield slice(start, min(n, start + CHUNK))


def absmax(x) -> float:
    """max |x| over the finite values (0 for an empty array), in blocks."""
    f = _flat(x)
    out = 0.0
    for sl in _blocks(f.size):
        blk = np.abs(f[sl].astype(np.float64))
        blk = blk[np.isfinite(blk)]
        if blk.size:
            out = max(out, float(blk.max()))
    return out


def all_finite(x) -> bool:
    f = _flat(x)
    return all(bool(np.isfinite(f[sl]).all()) for sl in _blocks(f.size))


def metrics(cand: np.ndarray, ref: np.ndarray, probe: str = "") -> dict:
    """The metrics of ``cand`` against ``ref`` (same shape), reduced in blocks of
    ``CHUNK`` elements (memory-mapped probes are read block by block)."""
    shape = np.shape(ref)
    fa, fb = _flat(ref), _flat(cand)
    n = fa.size
    if n == 0:
        return dict(max_abs=0.0, max_rel=0.0, mean_abs=0.0, rmse=0.0, nmse=0.0, cosine=1.0,
                    worst="", min_atol=0.0, finite=all_finite(ref) and all_finite(cand))
    ref_scale = 0.0
    one = n <= CHUNK  # one block (nearly every probe): widened once, read by both passes
    for sl in _blocks(n):
        a = fa[sl].astype(np.float64, copy=False)  # read only: a float64 probe is not copied
        b = fb[sl].astype(np.float64, copy=False)
        bad = ~(np.isfinite(a) & np.isfinite(b))
        if bad.any():
            idx = np.unravel_index(sl.start + int(np.argmax(bad)), shape)
            return dict(max_abs=math.inf, max_rel=math.inf, mean_abs=math.inf, rmse=math.inf, nmse=math.inf,
                        cosine=math.nan, worst=_name_index(tuple(int(i) for i in idx), probe), min_atol=math.inf,
                        finite=False)
        ref_scale = max(ref_scale, float(np.abs(a).max()))
    floor = 1e-12 * ref_scale + 1e-300
    sa = sd = sb = sab = sum_abs = 0.0
    max_abs, max_rel, worst = -1.0, 0.0, 0
    for sl in _blocks(n):
        if not one:
            a = fa[sl].astype(np.float64, copy=False)
            b = fb[sl].astype(np.float64, copy=False)
        d = b - a
        ad = np.abs(d)
        j = int(np.argmax(ad))
        if ad[j] > max_abs:
            max_abs, worst = float(ad[j]), sl.start + j
        max_rel = max(max_rel, float(np.max(ad / (np.abs(a) + floor))))
        sum_abs += float(ad.sum())
        sa += float(np.sum(a * a))
        sd += float(np.sum(d * d))
        sb += float(np.sum(b * b))
        sab += float(np.sum(a * b))
    nmse = sd / sa if sa > 0 else (0.0 if sd == 0 else math.inf)
    cos = float(sab / math.sqrt(sa * sb)) if sa > 0 and sb > 0 else (1.0 if sa == sb else 0.0)
    idx = np.unravel_index(worst, shape)
    return dict(
        max_abs=max_abs,
        max_rel=max_rel,
        mean_abs=sum_abs / n,
        rmse=math.sqrt(sd / n),
        nmse=nmse,
        cosine=cos,
        worst=_name_index(tuple(int(i) for i in idx), probe),
        min_atol=max_abs,
        finite=True,
    )


def _name_index(idx: tuple, probe: str) -> str:
    axes = probe_axes(probe, len(idx))  # the probe vocabulary's own names (contract.probes)
    return ",".join(f"{n}={i}" for n, i in zip(axes, idx))


# The probes whose heads keep their own time scales (issue 40): a recurrent state's head
# decays by its own exp(-A dt) per row, and a slow head -- the one that remembers for
# hundreds of rows -- holds a SMALL state (its writes are scaled by its small dt: HF
# Mamba2Mixer ``dB = dt * B``, ggml ssm_scan ``x_dt``), so the whole tensor's NMSE is
# the fast heads'. A state kept in bfloat16 loses its rounding in the slow heads only:
# mamba2, 128 rows in two calls on --weights trained, layer 0's state -- over the whole
# tensor 2.4e-5 planted, 1.4e-5 HF's cached path's own (passes); in head 0, 1.56e-4
# planted, 3.8e-6 unplanted, 6.4e-6 HF's own. Judged head by head as well.
HEADWISE = ("state_rec",)


def head_nmse(cand, ref, probe: str) -> np.ndarray | None:
    """Each head's NMSE of ``cand`` against ``ref`` (a ``HEADWISE`` probe: each head over
    its sequences, calls and elements), or None for any other probe. A head whose
    reference is all zeros: 0 if the candidate is too, else inf."""
    if probe not in HEADWISE:
        return None
    axes = probe_axes(probe, np.ndim(ref))
    if "head" not in axes:
        return None
    h = axes.index("head")
    shape = np.shape(ref)
    sd, sa = np.zeros(shape[h]), np.zeros(shape[h])
    rest = tuple(range(1, len(shape) - h))
    # one call's state at a time (the axes before the head: sequence, call), so the float64
    # temporaries stay one state's size whatever the probe's (a decode schedule's is one
    # state per call: harness/budget.py counts the probe, not copies of it)
    for idx in np.ndindex(*shape[:h]):
        a = np.asarray(ref[idx], dtype=np.float64)
        d = np.asarray(cand[idx], dtype=np.float64) - a
        sd += (d * d).sum(axis=rest)
        sa += (a * a).sum(axis=rest)
    return np.where(sa > 0, sd / np.where(sa > 0, sa, 1.0), np.where(sd > 0, np.inf, 0.0))


def worst_head(heads, tol: dict) -> tuple[int, float, float]:
    """``(head, candidate's NMSE, bound)`` of the head furthest over its own bound:
    ``ratio`` times the reference's NMSE IN THAT HEAD (floored as the whole tensor's
    is) -- head by head, since a slow head's error is its own, not the fast heads'."""
    cand, ref = heads
    bound = tol["ratio"] * np.maximum(ref, tol["nmse_floor"])
    w = int(np.argmax(cand / bound))
    return w, float(cand[w]), float(bound[w])


def judge(m: dict, tol: dict) -> tuple[str, str]:
    """``(status, reason)`` for absolute metrics under ``tol`` (nmse, atol)."""
    if not m["finite"]:
        return "fail", f"non-finite values at {m['worst']}"
    over = []
    if m["nmse"] > tol["nmse"]:
        over.append(f"nmse {m['nmse']:.3g} > {tol['nmse']:.3g}")
    if m["max_abs"] > tol["atol"]:
        over.append(f"max_abs {m['max_abs']:.3g} > {tol['atol']:.3g} at {m['worst']}")
    return ("fail", "; ".join(over)) if over else ("pass", "")


def judge_against_oracle(cand_m: dict, ref_m: dict, tol: dict, oracle_finite: bool = True,
                         heads: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[str, str, float]:
    """Judged against a float64 oracle (the REFERENCE in float64, fed the same layer
    inputs: harness/case.py): the candidate's distance to it must be at most
    ``ratio`` times the reference's own distance (floored at ``nmse_floor``), so a
    bug and rounding noise are told apart -- and never more than the dtype's own
    bounds (``nmse``, ``atol``: a result worse than those is not rounding at that
    precision, whatever the reference did). A non-finite candidate, reference or
    oracle fails. ``heads``: the candidate's and the reference's NMSE to the oracle
    head by head (``head_nmse``), each head held to the same ratio of the reference's
    in that head (``worst_head``; a check of its own, beside the whole tensor's).
    Returns ``(status, reason, nmse bound applied)``."""
    allowed = min(tol["ratio"] * max(ref_m["nmse"], tol["nmse_floor"]), tol["nmse"])
    if not (cand_m["finite"] and ref_m["finite"] and oracle_finite):
        who = "candidate" if not cand_m["finite"] else "reference" if not ref_m["finite"] else "oracle"
        where = cand_m["worst"] if not cand_m["finite"] else ref_m["worst"]
        return "fail", f"non-finite values in the {who} at {where}", allowed
    over = []
    if cand_m["nmse"] > allowed:
        why = (f"{tol['ratio']:g} x reference's {ref_m['nmse']:.3g} (floor {tol['nmse_floor']:.3g})"
               if allowed < tol["nmse"] else f"the dtype's bound {tol['nmse']:.3g}")
        over.append(f"nmse to the float64 oracle {cand_m['nmse']:.3g} > {allowed:.3g} = {why}")
    if cand_m["max_abs"] > tol["atol"]:
        over.append(f"max_abs to the float64 oracle {cand_m['max_abs']:.3g} > {tol['atol']:.3g} at {cand_m['worst']}")
    if heads is not None:
        w, got, bound = worst_head(heads, tol)
        if got > bound:
            over.append(f"head {w}'s nmse to the float64 oracle {got:.3g} > {bound:.3g} = {tol['ratio']:g} x "
                        f"reference's {heads[1][w]:.3g} in that head (floor {tol['nmse_floor']:.3g})")
    return ("fail", "; ".join(over), allowed) if over else ("pass", "", allowed)
