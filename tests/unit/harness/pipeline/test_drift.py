"""harness/pipeline/judge.py ``drift_bound``: a free-running reference that rounds its
activations (llama.cpp on quantized weights) against a float one is bounded by
``drift_ratio`` x the drift of that rounding reproduced in the float run, floored at
float32's own, and never by the table where a drift was measured (unless asked to keep it)."""

from __future__ import annotations

import math

import pytest

from harness import scaling
from harness.pipeline.judge import drift_bound

BASE = {"nmse": 1e-10, "atol": 1e-4, "drift_ratio": 4.0, "drift_nmse_floor": 1e-12, "drift_atol_floor": 1e-5}
TABLE = {"nmse": 1e-3, "atol": 1e-1}  # the quantized dtype's table entry


def _dm(nmse, max_abs=0.0, finite=True):
    return {"nmse": nmse, "max_abs": max_abs, "finite": finite}


def test_the_bound_is_ratio_times_the_drift():
    tol, why = drift_bound(BASE, TABLE, _dm(1e-6, 1e-2), None, 1.0, "")
    assert tol["nmse"] == pytest.approx(4e-6) and tol["atol"] == pytest.approx(4e-2)
    assert "4 x the drift" in why and "nmse 1e-06" in why


def test_where_nothing_was_rounded_yet_the_floor_is_float32_s():
    tol, _ = drift_bound(BASE, TABLE, _dm(0.0, 0.0), None, 1.0, "")
    assert tol["nmse"] == pytest.approx(1e-12) and tol["atol"] == pytest.approx(1e-5)
    # the floor scales as any float32 bound does: with the reference's scale and the RoPE reach
    rope = scaling.RopeSize(mean_sq=1e8, max_weighted=1e4)
    tol, _ = drift_bound({**BASE, "rope_nmse": 8.0, "rope_atol": 4.0}, TABLE, _dm(0.0), rope, 10.0, "")
    eps = 2.0 ** -24
    assert tol["nmse"] == pytest.approx(1e-12 + 8.0 * eps * eps * 1e8)
    assert tol["atol"] == pytest.approx(1e-5 * 10.0 + 4.0 * eps * 1e4 * 10.0)


def test_keep_table_takes_the_larger_downstream_of_an_unrounded_matmul():
    tol, why = drift_bound(BASE, TABLE, _dm(1e-6, 1e-2), None, 1.0, "", keep_table=True)
    assert tol["nmse"] == TABLE["nmse"] and tol["atol"] == TABLE["atol"]
    assert "MoE experts" in why


def test_a_non_finite_drift_run_leaves_the_table():
    tol, why = drift_bound(BASE, TABLE, _dm(math.inf, finite=False), None, 1.0, "as written")
    assert tol == TABLE and why == "as written"
