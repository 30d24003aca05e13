"""harness/scaling.py: the bounds that grow with the case (RoPE reach, the float32 floor
at the reduction width, the residual's share of an amplified error)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from harness import scaling

TOL = {"nmse": 1e-10, "atol": 1e-4, "rope_nmse": 8.0, "rope_atol": 4.0}


def _lc(inv_freq):
    return SimpleNamespace(rope=SimpleNamespace(inv_freq=np.asarray(inv_freq, dtype=np.float64)))


def test_rope_reach_is_the_mean_and_max_of_pos_times_freq_times_one_plus_pair():
    f = np.array([1.0, 0.1, 0.01])
    n = 7
    p = np.arange(n)[:, None]
    w = p * f[None, :] * (1 + np.arange(f.size))[None, :]  # every position and pair, by brute force
    got = scaling.rope_size(_lc(f), n)
    assert got.mean_sq == pytest.approx(float(np.mean(w ** 2)), rel=1e-12)
    assert got.max_weighted == pytest.approx(float(w.max()), rel=1e-12)


def test_no_rope_and_no_tokens_reach_nothing():
    assert scaling.rope_size(SimpleNamespace(rope=None), 16) is None
    assert scaling.rope_size(SimpleNamespace(), 16) is None
    assert scaling.rope_size(_lc([1.0]), 0) is None
    one = scaling.rope_size(_lc([1.0, 0.5]), 1)  # position 0 alone: angle 0
    assert one.mean_sq == 0 and one.max_weighted == 0


def test_the_reach_grows_with_the_length_squared():
    a, b = scaling.rope_size(_lc([1.0, 0.1]), 100), scaling.rope_size(_lc([1.0, 0.1]), 1000)
    assert b.mean_sq / a.mean_sq == pytest.approx((999 * 1999) / (99 * 199), rel=1e-12)
    assert b.max_weighted / a.max_weighted == pytest.approx(999 / 99)


def test_the_floor_grows_with_the_reduction_width_past_its_calibration():
    tol = {"nmse_floor": 1e-14, "floor_width": 256}
    assert scaling.floor_for(tol, 64) == 1e-14  # never below the table's
    assert scaling.floor_for(tol, 256) == 1e-14
    assert scaling.floor_for(tol, 1024) == pytest.approx(4e-14)
    assert scaling.floor_for(tol, None) == 1e-14
    assert scaling.floor_for({"nmse_floor": 1e-14}, 4096) == 1e-14  # no floor_width: the table's at any width
    assert scaling.floor_for({}, 4096) is None


def test_scaled_without_rope_keeps_nmse_and_scales_atol_by_the_reference():
    out = scaling.scaled(TOL, None, "float32", ref_scale=30.0)
    assert out["nmse"] == TOL["nmse"]
    assert out["atol"] == pytest.approx(TOL["atol"] * 30.0)
    # below unit scale atol stays absolute; a non-finite scale leaves it as written
    assert scaling.scaled(TOL, None, "float32", ref_scale=0.01)["atol"] == TOL["atol"]
    assert scaling.scaled(TOL, None, "float32", ref_scale=math.inf)["atol"] == TOL["atol"]


def test_scaled_with_rope_adds_the_angle_terms_at_the_reference_s_angle_precision():
    rope = scaling.RopeSize(mean_sq=1e6, max_weighted=2e3)
    eps = 2.0 ** -24
    out = scaling.scaled(TOL, rope, "float32", ref_scale=3.0)
    assert out["nmse"] == pytest.approx(TOL["nmse"] + 8.0 * eps * eps * 1e6)
    assert out["atol"] == pytest.approx(TOL["atol"] * 3.0 + 4.0 * eps * 2e3 * 3.0)
    f64 = scaling.scaled(TOL, rope, "float64", ref_scale=3.0)  # HF's float64 angles: far smaller terms
    assert TOL["nmse"] < f64["nmse"] < out["nmse"]
    assert f64["nmse"] == pytest.approx(TOL["nmse"] + 8.0 * 2.0 ** -106 * 1e6)


def test_scaled_floors_at_the_reduction_width():
    out = scaling.scaled({**TOL, "nmse_floor": 1e-14, "floor_width": 256}, None, "float32", 1.0, width=2048)
    assert out["nmse_floor"] == pytest.approx(8e-14)


def test_the_residual_carries_the_amplified_error_diluted_by_its_energy():
    probes = {"L0.attn_out": np.full(4, 1.0), "L0.resid_mid": np.full(4, 10.0)}
    assert scaling.residual_floor_scale(1.0, probes, 0) == 1.0  # nothing amplified
    assert scaling.residual_floor_scale(500.0, probes, 0) == pytest.approx(500.0 * 4 / 400)
    assert scaling.residual_floor_scale(50.0, probes, 0) == 1.0  # diluted below the plain floor: never under it
    assert scaling.residual_floor_scale(500.0, {}, 0) == 1.0


def test_a_layer_without_an_output_norm_amplifies_nothing():
    assert scaling.output_norm_amplification(SimpleNamespace(), {}, 0) == 1.0
