"""harness/compare.py: the two verdict rules -- absolute (nmse and atol) and against the
float64 oracle (ratio x the reference's own distance, floored, never past the dtype's)."""

from __future__ import annotations

import numpy as np
import pytest

from harness import compare

TOL = {"nmse": 1e-8, "atol": 1e-3, "ratio": 4.0, "nmse_floor": 1e-14}


def _m(nmse, max_abs=0.0, finite=True):
    return {"nmse": nmse, "max_abs": max_abs, "finite": finite, "worst": "t=0"}


def test_absolute_rule_fails_past_either_bound():
    assert compare.judge(_m(1e-8, 1e-3), TOL)[0] == "pass"  # at the bound: passes
    st, why = compare.judge(_m(1.01e-8, 0.0), TOL)
    assert st == "fail" and "nmse" in why
    st, why = compare.judge(_m(0.0, 1.01e-3), TOL)
    assert st == "fail" and "max_abs" in why and "t=0" in why
    assert compare.judge(_m(0.0, finite=False), TOL)[0] == "fail"


@pytest.mark.parametrize("ref_nmse, allowed", [
    (1e-12, 4e-12),   # ratio x the reference's own distance
    (1e-16, 4e-14),   # floored: the reference rounded luckily
    (1e-8, 1e-8),     # capped at the dtype's bound, whatever the reference did
])
def test_oracle_rule_allows_ratio_times_the_reference_floored_and_capped(ref_nmse, allowed):
    st, _, got = compare.judge_against_oracle(_m(allowed), _m(ref_nmse), TOL)
    assert got == pytest.approx(allowed) and st == "pass"
    st, why, _ = compare.judge_against_oracle(_m(allowed * 1.01), _m(ref_nmse), TOL)
    assert st == "fail" and "float64 oracle" in why


def test_oracle_rule_keeps_the_absolute_bound_and_fails_any_non_finite_side():
    assert compare.judge_against_oracle(_m(0.0, 2e-3), _m(1e-12), TOL)[0] == "fail"
    for cand, ref, oracle_ok, who in ((_m(0, finite=False), _m(0), True, "candidate"),
                                      (_m(0), _m(0, finite=False), True, "reference"),
                                      (_m(0), _m(0), False, "oracle")):
        st, why, _ = compare.judge_against_oracle(cand, ref, TOL, oracle_ok)
        assert st == "fail" and who in why


def test_metrics_measure_what_the_rules_read():
    ref = np.array([[1.0, -2.0], [3.0, 4.0]])
    cand = ref + np.array([[0.0, 0.0], [0.0, 0.1]])
    m = compare.metrics(cand, ref)
    assert m["max_abs"] == pytest.approx(0.1)
    assert m["nmse"] == pytest.approx(0.01 / np.sum(ref ** 2), rel=1e-9)
    assert m["finite"]
    assert not compare.metrics(np.array([np.nan, 1.0]), np.array([1.0, 1.0]))["finite"]


def _state(rng, scales):
    """A state probe [S, calls, Hv, Dk, Dv] whose heads have the given magnitudes."""
    x = rng.standard_normal((1, 2, len(scales), 4, 4))
    return x * np.asarray(scales)[None, None, :, None, None]


def test_a_small_slow_heads_error_fails_head_by_head_though_the_tensor_passes():
    """issue 40: a slow head holds a small state; its rounding is invisible in the
    whole tensor's NMSE and is judged against the reference's error IN THAT HEAD."""
    rng = np.random.default_rng(0)
    oracle = _state(rng, [1.0, 1.0, 1e-2])
    noise = _state(rng, [1.0, 1.0, 1e-2])
    ref = oracle + 1e-3 * noise  # the reference's own rounding: relative 1e-3 in every head
    cand = oracle + 1e-3 * noise * np.asarray([1, 1, 30])[None, None, :, None, None]  # head 2: 30x
    cm, rm = compare.metrics(cand, oracle, "state_rec"), compare.metrics(ref, oracle, "state_rec")
    tol = dict(TOL, nmse=1e-2, atol=1.0, nmse_floor=1e-9)
    assert compare.judge_against_oracle(cm, rm, tol)[0] == "pass"  # the tensor alone cannot see it
    heads = compare.head_nmse(cand, oracle, "state_rec"), compare.head_nmse(ref, oracle, "state_rec")
    st, why, _ = compare.judge_against_oracle(cm, rm, tol, heads=heads)
    assert st == "fail" and why.startswith("head 2's nmse")
    # paired head by head: the candidate's worst head against the reference's in that head
    same = compare.head_nmse(ref, oracle, "state_rec")
    assert compare.judge_against_oracle(rm, rm, tol, heads=(same, same))[0] == "pass"
    assert compare.worst_head((same * [1, 1, 5], same), tol)[0] == 2


def test_head_nmse_is_for_state_probes_and_names_an_empty_head():
    a = np.zeros((1, 1, 2, 2, 2))
    b = a.copy()
    b[0, 0, 1, 0, 0] = 1e-3
    assert compare.head_nmse(b, a, "attn_out") is None
    per = compare.head_nmse(b, a, "state_rec")
    assert per[0] == 0.0 and per[1] == np.inf
