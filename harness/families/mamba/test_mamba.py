"""mamba: the Mamba-1 layers judged probe by probe against HF's full forward, HF's
cached path and llama.cpp, their conv and SSM states at every call boundary
(llama.cpp names only attn_norm and l_out: the rest is not-exposed with the reason);
HF's cached multi-row scan that drops the carried state is a finding bounded by the
schedule (never a prefill, never one row per later call); planted bugs in the
x_proj split and the D skip fail where they act, against every reference that
sees them."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

HF_PROBES = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
             "attn_branch", "attn_out", "resid_mid")
LC_NAMED = ("attn_in", "resid_mid", "state_conv", "state_rec")
LC_UNNAMED = ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
              "attn_branch", "attn_out")
# impl vs hf_cached where HF's cached scan restarts from zero (findings.toml)
DROPPED = ("rec_out", "state_rec", "attn_branch", "attn_out", "resid_mid")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]


def check_three_way(rows, family, lc_where, state_finding):
    """Every probe of both layers against the three references; ``state_finding``: the
    schedule has a multi-row call after the first, where HF's cached scan drops the
    state (the finding) -- else hf_cached must pass outright."""
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    for layer in (0, 1):
        assert {r["layer_kind"] for r in rows if r["layer"] == layer and r["candidate"] == "impl"} == {"mamba1"}
        for probe in HF_PROBES:
            assert st[("impl", "hf", layer, probe)] == "pass", (layer, probe)
        for probe in HF_PROBES + ("state_conv", "state_rec"):
            # teacher-forced, everything before the scan agrees with hf_cached whatever the schedule
            want = "finding" if state_finding and probe in DROPPED else "pass"
            assert st[("impl", "hf_cached", layer, probe)] == want, (layer, probe)
        assert st[("impl", "hf", layer, "state_rec")] == "not-exposed"
        for probe in LC_NAMED:
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        unnamed = [r for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp"
                   and r["layer"] == layer and r["probe"] in LC_UNNAMED]
        assert {r["probe"] for r in unnamed} == set(LC_UNNAMED)
        assert all(r["status"] == "not-exposed" and lc_where in r["reason"] for r in unnamed)
        assert st[("llamacpp", "hf", layer, "layer_out")] == "pass"
    assert [r["status"] for r in rows if r["candidate"] == "llamacpp" and r["reference"] == "hf"
            and r["probe"] == "logits"] == ["pass"]
    found = [r for r in rows if r["status"] == "finding"]
    assert bool(found) == state_finding
    assert all(f"finding {family}#" in r["reason"] and "modeling_" in r["reason"] for r in found)
    if state_finding:
        assert st[("impl", "hf_cached", 0, "rec_out")] == "finding"
        assert st[("hf_cached", "hf", 0, "rec_out")] == "finding"
        assert st[("llamacpp", "hf_cached", 0, "state_rec")] == "finding"


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule,dropped", [("batched", "5,1,10", True), ("paged", "mixed", False),
                                                 ("decode", "prefill", False)])
def test_mamba_three_way_with_its_states(run, policy, kv, schedule, dropped):
    check_three_way(run(policy, family="mamba", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule), "mamba",
                    "build_mamba_layer", dropped)


@pytest.mark.parametrize("chunks,excused", [(((5, 1, 10),), True), (((3, 1, 2, 1, 9),), True),
                                            (((16,),), False), (((8,) + (1,) * 8,), False),
                                            (((1,) * 16,), False), (((8,) + (1,) * 8, (5, 1, 10)), True)])
def test_the_dropped_state_finding_is_bounded_by_the_schedule(finding, policy, chunks, excused):
    """HF's cached path is excused only where a later call carries several rows: a
    prefill, one row per call and prefill + one row per call must agree outright."""
    for cand, ref, probe in (("hf_cached", "hf", "rec_out"), ("impl", "hf_cached", "rec_out"),
                             ("llamacpp", "hf_cached", "state_rec"), ("llamacpp", "hf_cached", "logits")):
        got = finding(policy, "mamba", cand, ref, probe, layer_kind="mamba1", nmse=1e-3, chunks=chunks,
                      layer=None if probe == "logits" else 0)
        assert bool(got) == excused, (cand, ref, probe, chunks, got)
    # bounded by its size: a larger disagreement at the same schedule is not excused
    assert finding(policy, "mamba", "impl", "hf_cached", "rec_out", layer_kind="mamba1", nmse=1e3,
                   chunks=((5, 1, 10),)) is None
    # and against the full forward or llama.cpp (they compute the state) nothing is excused
    assert finding(policy, "mamba", "impl", "hf", "rec_out", layer_kind="mamba1", nmse=1e-3,
                   chunks=((5, 1, 10),)) is None
    assert finding(policy, "mamba", "impl", "llamacpp", "resid_mid", layer_kind="mamba1", nmse=1e-3,
                   chunks=((5, 1, 10),)) is None


MUTANTS = registry()


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("name,hf_first,cached,lc_first", [
    ("mamba1-x-proj-b-c-swapped", "rec_q", "state_rec", "state_rec"),
    ("mamba1-d-skip-one-channel", "rec_out", "rec_out", "resid_mid"),  # the skip leaves the state alone
    ("recurrent-state-not-carried", None, "state_rec", "state_rec")])  # one call (hf) cannot show it
def test_planted_bugs_fail_where_they_act(run, policy, name, hf_first, cached, lc_first):
    """Each against HF (teacher-forced: the full forward where the bug acts in one
    call, HF's cached path for the state between calls) and against llama.cpp, which
    names only the states and l_out inside the layer."""
    with applied(MUTANTS[name]):
        st = all_statuses(run(policy, family="mamba", ref=HF_AND_LLAMACPP, schedule="mixed"))
    if hf_first:
        assert st[("impl", "hf", 0, hf_first)] == "fail", name
        assert st[("impl", "hf", 0, "attn_in")] == "pass"
    assert st[("impl", "hf_cached", 0, cached)] == "fail", name
    assert st[("impl", "llamacpp", 0, lc_first)] == "fail", name
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"  # the references still agree


@pytest.mark.usefixtures("need_llamacpp")
def test_export_without_neg_exp_a_log_is_caught(run, policy, monkeypatch, tmp_path):
    """The converter's A_log -> -exp(A_log) (conversion/mamba.py MambaModel.modify_tensors)
    is what makes llama.cpp's decay agree: written raw, llama.cpp's first SSM state
    leaves HF's. (A cache of its own: the capture cache keys on the family's source
    files, which the patch leaves alone.)"""
    from harness.families import get

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    fam = get("mamba")
    monkeypatch.setattr(type(fam), "gguf_value_map", lambda self, name, data, config: data)
    st = all_statuses(run(policy, family="mamba", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "state_rec")] == "fail"


@pytest.mark.parametrize("bad", [1, 0, True, "2", 2.5])
def test_a_schedule_key_that_would_excuse_any_schedule_is_refused(bad):
    """later_call_rows_at_least = 1 would hold for one row per call too (every call
    carries a row): refused in one line, as every malformed finding is."""
    from harness.errors import UsageError
    from harness.policy import _check_finding

    with pytest.raises(UsageError, match="later_call_rows_at_least must be an integer >= 2") as e:
        _check_finding("p.toml", "x", {"family": "mamba", "candidate": "hf_cached", "reference": "hf", "reason": "r",
                                       "later_call_rows_at_least": bad})
    assert "\n" not in str(e.value)


def check_mlx_norm_eps(run, policy, family):
    """mlx-lm's mamba.py builds the block's input norm as nn.RMSNorm(hidden_size), eps 1e-5
    whatever layer_norm_epsilon says: at 1e-6 (the fuzz draws it) mlx differs from L0
    attn_in on, a finding; impl passes against HF; at the tiny config's 1e-5 there is no
    finding, so the rows show the eps is the whole difference. falcon_mamba runs through
    the same mlx-lm file."""
    kw = dict(family=family, ref="hf,mlx", schedule="prefill", tokens=16)
    st = all_statuses(run(policy, overrides=(("layer_norm_epsilon", 1e-6),), **kw))
    assert st[("impl", "hf", 0, "attn_branch")] == "pass"
    assert st[("impl", "mlx", 0, "attn_branch")] == "finding"
    same = all_statuses(run(policy, **kw))
    assert same[("impl", "mlx", 0, "attn_branch")] == "pass"


@pytest.mark.usefixtures("need_mlx")
def test_mlx_norms_the_block_input_at_its_own_default_eps(run, policy):
    check_mlx_norm_eps(run, policy, "mamba")
