"""Every decoration impl implements, broken on purpose, must fail its comparison
-- at the probe where the break first acts, with everything before it passing."""

from __future__ import annotations

import pytest

from conftest import run
from harness.mutants import StaleMutant, applied, registry
from impl.trace import LAYER_PROBES

MUTANTS = registry()


def _case(m):
    kw = dict(m.case)
    kw.setdefault("ref", "hf")
    return kw


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught_at_its_probe(policy, name):
    m = MUTANTS[name]
    clean = [r for r in run(policy, **_case(m)) if r["candidate"] == "impl"]
    # not-implemented: a layer kind impl does not claim (qwen3_next's delta-net layers)
    assert clean and any(r["status"] == "pass" for r in clean), "the case compared nothing of impl"
    assert all(r["status"] in ("pass", "not-exposed", "not-implemented") for r in clean), \
        "the case must pass without the mutant, or the test proves nothing"
    with applied(m):
        rows = run(policy, **_case(m))
    ref = _case(m)["ref"]  # hf, or the reference the mutant's class is about (llama.cpp alone)
    impl = [r for r in rows if r["candidate"] == "impl" and ref in (r["reference"], "all")]
    failing = [r for r in impl if r["status"] in ("fail", "error")]
    assert failing, f"mutant {name} survived"
    order = {p: i for i, p in enumerate(LAYER_PROBES)}
    first = min(failing, key=lambda r: (r["layer"], order.get(r["probe"], 99)))
    assert first["probe"] == m.first_probe, (first["layer"], first["probe"], first["reason"])
    if m.layer is not None:
        assert first["layer"] == m.layer


def test_every_implemented_decoration_has_a_mutant():
    """Decorations the foundation families exercise must each be broken by some mutant."""
    covered = {m.decoration for m in MUTANTS.values()}
    for tag in ("gqa", "qkv_bias", "qk_norm_head", "rope_neox", "attn_scale", "sliding_window", "kv_paged"):
        assert tag in covered, tag
    # features II (harness/kinds/attention/mutants/features2.py)
    for tag in ("q_gate_interleaved", "sub_norm", "value_scale"):
        assert tag in covered, tag
    # the output gate (afmoe) and the wo scale (llama wo_scale): harness/kinds/attention/mutants/features4.py
    for tag in ("output_gate", "o_scale"):
        assert tag in covered, tag


def test_a_stale_mutant_is_an_error_not_a_survivor():
    from harness.mutants import Mutant

    m = Mutant("stale", "gqa", "impl.attention", "this snippet is not in the file", "x", {"family": "llama"}, "q")
    with pytest.raises(StaleMutant):
        with applied(m):
            pass


def test_mutant_is_undone_on_exit(policy):
    m = MUTANTS["scale-squared"]
    with applied(m):
        pass
    rows = run(policy, family="llama", ref="hf", seed=3)
    assert len([r for r in rows if r["candidate"] == "impl"]) >= 20 and all(r["status"] == "pass" for r in rows)
