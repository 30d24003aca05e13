"""harness/budget.py: the position limit and the memory plan -- everything as asked, then
without the float64 oracle, then (a float64 case) HF in float32, then a one-line refusal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness import budget, families
from harness.errors import UsageError


def test_the_position_limit_is_the_first_key_families_name_it_by():
    cfg = SimpleNamespace(max_position_embeddings=0, max_seq_len=True, n_positions=512, seq_length=64)
    assert budget.max_positions(cfg) == ("n_positions", 512)  # 0 and a bool are no limit
    assert budget.max_positions(SimpleNamespace()) is None


def test_a_case_past_the_position_limit_is_refused_naming_the_key():
    run = SimpleNamespace(case=SimpleNamespace(tokens=65), config=SimpleNamespace(max_position_embeddings=64),
                          family=SimpleNamespace(name="tinyfam"))
    with pytest.raises(UsageError, match=r"--tokens 65 is past family tinyfam's max_position_embeddings=64"):
        budget.check(run)


def test_the_peak_is_what_is_held_plus_the_largest_phase():
    est = budget.Estimate(parts={"weights": 100, "weights copy": 10, "logits": 5000},
                          phases={"build": 7, "compare": 30})
    assert est.peak == 100 + 10 + 30  # logits are a phase's, not held


@pytest.fixture(scope="module")
def llama():
    fam = families.get("llama")
    config = fam.make_config({})
    return fam, config, fam.layer_configs(config)


def _est(llama, dtype, hf_dtype, oracle):
    fam, config, lcs = llama
    return budget.estimate(fam, config, lcs, tokens=16, seqs=1, dtype=dtype, refs=["hf"], hf_dtype=hf_dtype,
                           oracle=oracle).peak


def test_the_plan_is_the_fullest_run_that_fits(llama):
    fam, config, lcs = llama
    kw = dict(tokens=16, seqs=1, refs=["hf"])
    full, no_oracle = _est(llama, "float32", "float32", True), _est(llama, "float32", "float32", False)
    assert no_oracle < full  # the oracle's float64 module is a part of its own
    p = budget.plan(fam, config, lcs, dtype="float32", budget=full, **kw)
    assert p.oracle and p.hf_dtype == "float32" and not p.notes
    p = budget.plan(fam, config, lcs, dtype="float32", budget=full - 1, **kw)
    assert not p.oracle and p.skips_oracle and "float64 oracle was skipped" in p.notes[0]
    with pytest.raises(UsageError, match=r"needs about .* of memory .*--layers 0,-1"):
        budget.plan(fam, config, lcs, dtype="float32", budget=no_oracle - 1, **kw)


def test_a_float64_case_that_does_not_fit_runs_hf_in_float32(llama):
    fam, config, lcs = llama
    f64, f32 = _est(llama, "float64", "float64", False), _est(llama, "float64", "float32", False)
    assert f32 < f64
    p = budget.plan(fam, config, lcs, dtype="float64", budget=f64, tokens=16, seqs=1, refs=["hf"])
    assert p.hf_dtype == "float64" and not p.notes
    p = budget.plan(fam, config, lcs, dtype="float64", budget=f64 - 1, tokens=16, seqs=1, refs=["hf"])
    assert p.hf_dtype == "float32" and "HF ran in float32" in p.notes[0]


def test_the_estimate_grows_with_the_case(llama):
    fam, config, lcs = llama
    small = budget.estimate(fam, config, lcs, tokens=16, seqs=1, dtype="float32", refs=["hf"])
    long = budget.estimate(fam, config, lcs, tokens=256, seqs=1, dtype="float32", refs=["hf"])
    wide = budget.estimate(fam, config, lcs, tokens=16, seqs=4, dtype="float32", refs=["hf"])
    assert long.parts["layer probes"] > small.parts["layer probes"] and long.disk > small.disk
    assert wide.parts["layer probes"] > small.parts["layer probes"]
    assert small.parts["weights"] == budget.param_counts(fam, config).total * 4
