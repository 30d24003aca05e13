"""A float32 candidate against llama.cpp alone is sized as against HF (issue 40):
harness/pipeline/oracle.py sized_candidate / dtype_sizer / model_guard.

llama.cpp computes in float32, so its own distance to a float64 run says nothing of a
float32 candidate's precision: the flat table (NMSE 1e-10) was all that judged it, where
HF's oracle rule allows ~4e-13 at the tiny sizes. Now, where llama.cpp is the case's only
float reference, each probe is also held to `ratio` times what HF in float32 is off HF's
float64 run on llama.cpp's layer inputs -- HF's full forward for what leaves the layer,
its cached path for a state llama.cpp names (docs/measurements/
2026-12-07-float32-llamacpp-alone.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.mutants import applied, registry
from harness.pipeline import oracle
from harness.references.capture import RefCapture
from harness.pytest_fixtures import run


def _build(dtype, refs, gguf_type="f32"):
    return SimpleNamespace(case=SimpleNamespace(dtype=dtype, refs=refs, gguf_type=gguf_type))


@pytest.mark.parametrize("dtype, refs, gguf_type, sized", [
    ("float32", ["llamacpp"], "f32", True),  # llama.cpp alone: sized
    ("float32", ["hf", "llamacpp"], "f32", False),  # HF's own rule judges every probe already
    ("float32", ["llamacpp"], "q8_0", False),  # quantized: the pair is judged at ggml's activation type
    ("bfloat16", ["hf", "llamacpp"], "f32", True),  # half precision: sized wherever llama.cpp judges it
    ("float64", ["llamacpp"], "f32", False),  # float64: rounding_for's own rule (float64's bound)
])
def test_which_candidates_are_sized_against_llamacpp(dtype, refs, gguf_type, sized):
    rc = RefCapture("llamacpp", "float32", {})
    assert oracle.sized_candidate(_build(dtype, refs, gguf_type), rc) is sized
    assert not oracle.sized_candidate(_build(dtype, refs, gguf_type), RefCapture("hf", "float32", {}))


LIGHTNING = dict(family="minimax", dtype="float32", kv="paged", schedule="decode", tokens=256, ref="llamacpp")


def _rec_out(rows):
    return [r for r in rows if r["candidate"] == "impl" and r["probe"] == "rec_out"]


@pytest.mark.llamacpp
def test_a_lost_decay_residual_fails_against_llamacpp_alone_at_float32(policy, monkeypatch):
    """Issue 40's second class against llama.cpp alone: lightning's per-call decay
    fl(exp(-slope)) rounded afresh on each of 256 one-row calls (as llama.cpp's
    minimax-01.cpp and HF's cached path do), where impl carries the correction. Against
    the flat 1e-10 it passed at 0.058 of the bound; sized by HF's float32 full forward on
    llama.cpp's inputs it fails (11x at L1, as against HF). Unplanted, every row passes
    and is sized (its sizer distance recorded); with the rule switched off the mutant
    passes -- the test can fail."""
    rows = run(policy, **LIGHTNING)
    rec = _rec_out(rows)
    assert rec and all(r["status"] == "pass" for r in rows if r["candidate"] == "impl" and r["status"] != "not-exposed")
    assert all(r["nmse_ref_oracle"] is not None and r["nmse_ref_oracle"] < 1e-12 for r in rec)
    assert max(r["err_ratio"] for r in rec) < 0.5

    with applied(registry()["lightning-decay-residual-dropped"]):
        planted = run(policy, **LIGHTNING)
        monkeypatch.setattr(oracle, "sized_candidate", lambda build, rc: False)
        unsized = run(policy, **LIGHTNING)
    bad = [r for r in _rec_out(planted) if r["status"] == "fail"]
    assert bad and max(r["err_ratio"] for r in bad) > 4
    assert "hf in float32's rounding on llamacpp's layer inputs" in bad[0]["reason"]
    assert all(r["status"] == "pass" for r in _rec_out(unsized))
