"""Every registered family, three-way (impl, HF, llama.cpp), in every KV mode.

Families are discovered from the registry, so a new family is tested the day
it is added. Per-family specifics (decorations broken on purpose, findings,
extra configs) live in the families' own test modules and in the mutants."""

from __future__ import annotations

import pytest

from conftest import bad_rows, run
from harness.families import registry
from harness.testing import HF_AND_LLAMACPP

FAMILIES = sorted(registry())
# families whose llama.cpp graph computes another model from the first norm on: every impl
# vs llamacpp row is that finding (teacher-forced, impl holds to HF), so none can pass; the
# family's own test shows impl passing llama.cpp with llama.cpp's arithmetic
ALL_FINDING_AGAINST_LLAMACPP = {
    "phimoe": "phi3.cpp norms with an RMS norm plus bias where HF has LayerNorm (phimoe#1, from L0.attn_in); "
              "harness/families/phimoe/test_phimoe.py: impl with an rms input norm passes llama.cpp",
}


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_three_way(policy, need_llamacpp, family, kv):
    fam = registry()[family]
    rows = run(policy, family=family, ref=HF_AND_LLAMACPP if fam.gguf_arch else "hf", kv=kv)
    bad = bad_rows(rows)
    assert not bad, bad
    passed = {(r["candidate"], r["reference"]) for r in rows if r["status"] == "pass"}
    assert ("impl", "hf") in passed
    if family in ALL_FINDING_AGAINST_LLAMACPP:
        lc = {r["status"] for r in rows if (r["candidate"], r["reference"]) == ("impl", "llamacpp")}
        assert lc <= {"finding", "not-exposed"} and "finding" in lc, lc
    elif fam.gguf_arch:
        assert ("impl", "llamacpp") in passed and ("llamacpp", "hf") in passed
    # every layer impl implements was compared and passed its guard probe (an attention
    # layer's last attention probe, a recurrent layer's own: mamba2 has no attention
    # layer at all) against HF -- a case of findings or not-exposed rows alone proves nothing
    from harness.case import Case, CaseRun
    from harness.verdict import guard_probe

    lcs = CaseRun(Case(family=family), policy).layer_cfgs
    want = {(i, guard_probe(lc)) for i, lc in enumerate(lcs) if guard_probe(lc)}
    got = {(r["layer"], r["probe"]) for r in rows if r["candidate"] == "impl" and r["status"] == "pass"
           and r["reference"] == "hf"}
    assert want, "no layer impl implements was compared"
    assert want <= got, sorted(want - got)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_on_torch(policy, family):
    from harness.case import Case, CaseRun
    from harness.verdict import FAILING, guard_probe

    rows = run(policy, family=family, ref="hf", backend="torch", kv="paged")
    assert not [r for r in rows if r["status"] in FAILING]
    # every layer impl implements passed its last attention probe against HF: a case of
    # findings or not-exposed rows alone would prove nothing of the torch backend
    lcs = CaseRun(Case(family=family), policy).layer_cfgs
    want = {(i, guard_probe(lc)) for i, lc in enumerate(lcs) if guard_probe(lc)}
    got = {(r["layer"], r["probe"]) for r in rows if r["candidate"] == "impl" and r["status"] == "pass"}
    assert want and want <= got, sorted(want - got)
