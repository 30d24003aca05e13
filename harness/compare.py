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

# The axes of each canonical probe, for naming the worst element.
AXES = {
    "q": ("seq", "tok", "head", "ch"),
    "k": ("seq", "tok", "head", "ch"),
    "v": ("seq", "tok", "head", "ch"),
    "q_rope": ("seq", "tok", "head", "ch"),
    "k_rope": ("seq", "tok", "head", "ch"),
    "q_pe": ("seq", "tok", "head", "ch"),  # MLA (impl.mla); k_pe, q_latent, kv_latent are rows
    "q_absorbed": ("seq", "tok", "head", "ch"),
    "attn_probs": ("seq", "head", "tok", "key"),
    "attn_heads": ("seq", "tok", "head", "ch"),
    "logits": ("seq", "tok", "vocab"),
}
ROW_AXES = ("seq", "tok", "ch")
METRIC_KEYS = ("max_abs", "max_rel", "mean_abs", "rmse", "nmse", "cosine", "worst", "min_atol", "finite")


def metrics(cand: np.ndarray, ref: np.ndarray, probe: str = "") -> dict:
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64)
    finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
    if a.size == 0:
        return dict(max_abs=0.0, max_rel=0.0, mean_abs=0.0, rmse=0.0, nmse=0.0, cosine=1.0,
                    worst="", min_atol=0.0, finite=finite)
    if not finite:
        bad = np.argwhere(~(np.isfinite(a) & np.isfinite(b)))[0]
        return dict(max_abs=math.inf, max_rel=math.inf, mean_abs=math.inf, rmse=math.inf, nmse=math.inf,
                    cosine=math.nan, worst=_name_index(tuple(bad), probe), min_atol=math.inf, finite=False)
    d = b - a
    ad = np.abs(d)
    idx = np.unravel_index(int(np.argmax(ad)), ad.shape)
    ref_scale = float(np.abs(a).max())
    floor = 1e-12 * ref_scale + 1e-300
    sa = float(np.sum(a * a))
    sd = float(np.sum(d * d))
    sb = float(np.sum(b * b))
    nmse = sd / sa if sa > 0 else (0.0 if sd == 0 else math.inf)
    cos = float(np.sum(a * b) / math.sqrt(sa * sb)) if sa > 0 and sb > 0 else (1.0 if sa == sb else 0.0)
    max_abs = float(ad[idx])
    return dict(
        max_abs=max_abs,
        max_rel=float(np.max(ad / (np.abs(a) + floor))),
        mean_abs=float(ad.mean()),
        rmse=math.sqrt(sd / ad.size),
        nmse=nmse,
        cosine=cos,
        worst=_name_index(tuple(int(i) for i in idx), probe),
        min_atol=max_abs,
        finite=True,
    )


def _name_index(idx: tuple, probe: str) -> str:
    axes = AXES.get(probe, ROW_AXES if len(idx) == 3 else tuple(f"d{i}" for i in range(len(idx))))
    if len(axes) != len(idx):
        axes = tuple(f"d{i}" for i in range(len(idx)))
    return ",".join(f"{n}={i}" for n, i in zip(axes, idx))


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


def judge_against_oracle(cand_m: dict, ref_m: dict, tol: dict, oracle_finite: bool = True) -> tuple[str, str, float]:
    """Judged against a float64 oracle (the REFERENCE in float64, fed the same layer
    inputs: harness/case.py): the candidate's distance to it must be at most
    ``ratio`` times the reference's own distance (floored at ``nmse_floor``), so a
    bug and rounding noise are told apart -- and never more than the dtype's own
    bounds (``nmse``, ``atol``: a result worse than those is not rounding at that
    precision, whatever the reference did). A non-finite candidate, reference or
    oracle fails. Returns ``(status, reason, nmse bound applied)``."""
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
    return ("fail", "; ".join(over), allowed) if over else ("pass", "", allowed)
