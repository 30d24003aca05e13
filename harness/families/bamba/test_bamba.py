"""bamba: the Mamba-2 layers judged probe by probe against HF's full forward, HF's
cached path and llama.cpp (granitehybrid), their states at every call boundary; the
attention layer against HF's full forward, and against HF's cached path and
llama.cpp under the two findings (HF's cached positions restart at 0; llama.cpp
rotates other channel pairs) -- each bounded, each still failing past its bound; a
planted bug in the D skip and one in the partial rotation fail where they act."""

from __future__ import annotations

import pytest

from harness.kinds.mutant import Mutant
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

HF_REC_PROBES = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
                 "attn_branch", "attn_out", "resid_mid")
LC_REC_NAMED = ("attn_in", "rec_out", "attn_out", "resid_mid", "state_conv", "state_rec")
ATTN_PROBES = ("q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out", "resid_mid")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule", [("batched", "5,1,10"), ("paged", "mixed")])
def test_three_way_with_states_and_the_findings(run, policy, kv, schedule):
    rows = run(policy, family="bamba", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    assert {r["layer_kind"] for r in rows if r["layer"] == 1 and r["candidate"] == "impl"} == {"attention"}
    # layer 0 (before any attention layer): the Mamba layer agrees with every reference
    assert {r["layer_kind"] for r in rows if r["layer"] == 0 and r["candidate"] == "impl"} == {"mamba2"}
    for ref in ("hf", "hf_cached"):
        for probe in HF_REC_PROBES:
            assert st[("impl", ref, 0, probe)] == "pass", (ref, probe)
            assert st[("impl", "hf", 2, probe)] == "pass", probe
    for probe in LC_REC_NAMED:
        assert st[("impl", "llamacpp", 0, probe)] == "pass", probe
        assert st[("impl", "llamacpp", 2, probe)] == "pass", probe  # teacher-forced: layer 2 too
    for probe in ("state_conv", "state_rec"):
        for layer in (0, 2):
            assert st[("impl", "hf_cached", layer, probe)] == "pass"
        assert st[("llamacpp", "hf_cached", 0, probe)] == "pass"
    # the attention layer: HF's full forward agrees with impl on every probe ...
    for probe in ATTN_PROBES:
        assert st[("impl", "hf", 1, probe)] == "pass", probe
    # ... the pre-rotation probes with every reference, the rotation with neither other one
    for ref in ("hf_cached", "llamacpp"):
        for probe in ("q", "k", "v"):
            assert st[("impl", ref, 1, probe)] == "pass", (ref, probe)
        assert st[("impl", ref, 1, "q_rope")] == "finding", ref
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"
    assert st[("llamacpp", "hf", 1, "k_rope")] == "finding"


@pytest.mark.usefixtures("need_llamacpp")
def test_one_call_has_no_cached_path_finding(run, policy):
    """The cached path's positions restart per call: with one call there is nothing to
    restart, and HF's cached path agrees with impl on every probe."""
    st = all_statuses(run(policy, family="bamba", ref="hf_cached", schedule="prefill"))
    for probe in ATTN_PROBES:
        assert st[("impl", "hf_cached", 1, probe)] == "pass", probe


D_SKIP = Mutant("mamba2-d-skip-dropped", "d_skip", "impl.recurrent",
                "y = y + xp.astype(v, acc, copy=False) * skip", "y = y")


@pytest.mark.usefixtures("need_llamacpp")
def test_planted_bugs_fail_where_they_act(run, policy):
    with applied(D_SKIP):
        st = all_statuses(run(policy, family="bamba", ref=HF_AND_LLAMACPP, schedule="5,1,10"))
    for ref in ("hf", "hf_cached", "llamacpp"):
        assert st[("impl", ref, 0, "rec_out")] == "fail", ref
        assert st[("impl", ref, 0, "attn_in")] == "pass", ref
    # a partial rotation that pairs the wrong channels: HF's full forward sees it at
    # q_rope; against the references under a finding it is caught only where it
    # exceeds the finding's bound -- so the test reads HF, which has none
    with applied(registry()["partial-rotary-pairs-from-tail"]):
        st = all_statuses(run(policy, family="bamba", ref="hf", schedule="5,1,10"))
    assert st[("impl", "hf", 1, "q")] == "pass"
    assert st[("impl", "hf", 1, "q_rope")] == "fail"
