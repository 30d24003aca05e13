"""jamba: the Mamba-1 layers (weighted dt / B / C norms) judged probe by probe against
HF's full forward, HF's cached path and llama.cpp, their conv and SSM states at every
call boundary; the NoPE attention layer against all three (llama.cpp's Qcur / Kcur
enter kq unrotated); jamba.cpp's ``ffn_inp`` is the branch's output (attn_out) and
the residual sum is not exposed. HF's cached multi-row scan that drops the carried
state is a finding bounded by the schedule; a planted bug in B's norm weight fails
where it acts, against every reference that sees it."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

HF_REC = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
          "attn_branch", "attn_out", "resid_mid")
LC_REC_NAMED = ("attn_in", "attn_out", "state_conv", "state_rec")
LC_REC_UNNAMED = ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
                  "attn_branch")
ATTN = ("attn_in", "q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out",
        "resid_mid")
# impl vs hf_cached where HF's cached scan restarts from zero (findings.toml)
DROPPED = ("rec_out", "state_rec", "attn_branch", "attn_out", "resid_mid")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule,dropped", [("batched", "5,1,10", True), ("paged", "mixed", False),
                                                 ("decode", "prefill", False)])
def test_jamba_three_way_with_its_states(run, policy, kv, schedule, dropped):
    rows = run(policy, family="jamba", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    kinds = {i: {r["layer_kind"] for r in rows if r["layer"] == i and r["candidate"] == "impl"} for i in (0, 1, 2)}
    assert kinds == {0: {"mamba1"}, 1: {"attention"}, 2: {"mamba1"}}
    for layer in (0, 2):
        for probe in HF_REC:
            assert st[("impl", "hf", layer, probe)] == "pass", (layer, probe)
        for probe in HF_REC + ("state_conv", "state_rec"):
            want = "finding" if dropped and probe in DROPPED else "pass"
            assert st[("impl", "hf_cached", layer, probe)] == want, (layer, probe)
        for probe in LC_REC_NAMED:
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        unnamed = [r for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp"
                   and r["layer"] == layer and r["probe"] in LC_REC_UNNAMED]
        assert {r["probe"] for r in unnamed} == set(LC_REC_UNNAMED)
        assert all(r["status"] == "not-exposed" and "build_mamba_layer" in r["reason"] for r in unnamed)
    # the attention layer, fed each reference's own input: every probe, every reference
    for ref in ("hf", "hf_cached"):
        for probe in ATTN:
            assert st[("impl", ref, 1, probe)] == "pass", (ref, probe)
    for probe in ATTN[:-1]:
        assert st[("impl", "llamacpp", 1, probe)] == "pass", probe
    # jamba.cpp's ffn_inp names the branch's output: the residual sum is not exposed
    for layer in (0, 1, 2):
        r = next(r for r in rows if (r["candidate"], r["reference"], r["layer"], r["probe"])
                 == ("impl", "llamacpp", layer, "resid_mid"))
        assert r["status"] == "not-exposed" and "ffn_inp" in r["reason"], r
        assert st[("llamacpp", "hf", layer, "layer_out")] == "pass", layer
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"
    found = [r for r in rows if r["status"] == "finding"]
    assert bool(found) == dropped
    assert all("finding jamba#" in r["reason"] and "modeling_jamba.py" in r["reason"] for r in found)
    if dropped:
        assert st[("hf_cached", "hf", 0, "rec_out")] == "finding"
        assert st[("llamacpp", "hf_cached", 0, "state_rec")] == "finding"


@pytest.mark.parametrize("chunks,excused", [(((5, 1, 10),), True), (((16,),), False), (((8,) + (1,) * 8,), False),
                                            (((1,) * 16,), False), (((8,) + (1,) * 8, (5, 1, 10)), True)])
def test_the_dropped_state_finding_is_bounded_by_the_schedule(finding, policy, chunks, excused):
    """HF's cached path is excused only where a later call carries several rows; never
    between HF's full forward and llama.cpp, and never past a dropped state's size."""
    for cand, ref, probe in (("hf_cached", "hf", "rec_out"), ("impl", "hf_cached", "rec_out"),
                             ("llamacpp", "hf_cached", "state_rec"), ("llamacpp", "hf_cached", "logits")):
        got = finding(policy, "jamba", cand, ref, probe, layer_kind="mamba1", nmse=1e-3, chunks=chunks,
                      layer=None if probe == "logits" else 0)
        assert bool(got) == excused, (cand, ref, probe, chunks, got)
    kw = dict(layer_kind="mamba1", nmse=1e-3, chunks=((5, 1, 10),))
    assert not finding(policy, "jamba", "llamacpp", "hf", "rec_out", **kw)
    assert not finding(policy, "jamba", "impl", "llamacpp", "state_rec", **kw)
    assert not finding(policy, "jamba", "impl", "hf_cached", "rec_out", **{**kw, "nmse": 3.0})


@pytest.mark.usefixtures("need_llamacpp")
def test_planted_b_norm_weight_bug_fails_where_it_acts(run, policy):
    with applied(registry()["mamba1-b-norm-weight-dropped"]):
        st = all_statuses(run(policy, family="jamba", ref=HF_AND_LLAMACPP, schedule="mixed"))
    for ref in ("hf", "hf_cached"):
        assert st[("impl", ref, 0, "rec_q")] == "pass", ref  # C keeps its weight
        assert st[("impl", ref, 0, "rec_k")] == "fail", ref
        assert st[("impl", ref, 0, "rec_out")] == "fail", ref
    assert st[("impl", "hf_cached", 0, "state_rec")] == "fail"
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "state_rec")] == "fail"
    assert st[("impl", "llamacpp", 0, "attn_out")] == "fail"
    assert st[("impl", "llamacpp", 1, "attn_probs")] == "pass"  # the attention layer is untouched
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"
