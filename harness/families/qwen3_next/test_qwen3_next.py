"""qwen3_next: the gated delta-net layers judged probe by probe against HF's full
forward, HF's cached path and llama.cpp, their states at every call boundary; a
conv state that drops a row between calls fails at the first boundary it reaches;
the converter's +1 on the (1 + w) norms is what makes llama.cpp agree; the q/o
biases of attention_bias=True (HF-only: llama.cpp's qwen3next has no
attn_output.bias slot) against HF."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

REC_PROBES = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
              "attn_branch", "attn_out", "resid_mid")


@pytest.mark.usefixtures("need_llamacpp")
def test_delta_net_layers_three_way_with_their_states(run, policy):
    rows = run(policy, family="qwen3_next", ref=HF_AND_LLAMACPP, kv="batched")
    assert not [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]
    st = all_statuses(rows)
    for layer in (0, 2):
        assert {r["layer_kind"] for r in rows if r["layer"] == layer} == {"gated_delta_net"}
        for ref in ("hf", "hf_cached", "llamacpp"):
            for probe in REC_PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        # beta after its sigmoid: HF's scan argument; qwen3next.cpp names only the pre-sigmoid b
        assert st[("impl", "hf", layer, "rec_beta")] == "pass"
        assert st[("impl", "llamacpp", layer, "rec_beta")] == "not-exposed"
        # the states: at every call boundary against the references that run the calls
        for probe in ("state_conv", "state_rec"):
            assert st[("impl", "hf_cached", layer, probe)] == "pass"
            assert st[("impl", "llamacpp", layer, probe)] == "pass"
            assert st[("impl", "hf", layer, probe)] == "not-exposed"
            assert st[("llamacpp", "hf_cached", layer, probe)] == "pass"
        assert st[("hf_cached", "hf", layer, "rec_out")] == "pass"
    # the attention layers are compared probe by probe against every reference
    for ref in ("hf", "hf_cached", "llamacpp"):
        for probe in ("q", "k", "v", "q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out"):
            assert st[("impl", ref, 1, probe)] == "pass" and st[("impl", ref, 3, probe)] == "pass"


@pytest.mark.usefixtures("need_llamacpp")
def test_a_conv_state_that_drops_a_row_fails_at_the_first_boundary(case_run, run, policy):
    """The planted bug: the conv state kept between calls drops the call's last row (and
    keeps one stale row). Against every reference that runs the calls, the state after
    the FIRST call already differs -- while everything the first call computed still
    agrees -- and the second call's conv output then differs too."""
    m = registry()["recurrent-conv-state-shifted"]
    case = dict(family="qwen3_next", kv="batched", schedule="5,1,10")
    clean = all_statuses(run(policy, ref=HF_AND_LLAMACPP, **case))
    assert clean[("impl", "hf_cached", 0, "state_conv")] == "pass"
    with applied(m):
        for ref in ("hf_cached", "llamacpp"):
            cr = case_run(policy, ref=ref, **case)
            rc = cr.capture(ref)
            cap = cr.candidate.capture(cr, rc)
            got, want = cap.probes["L0.state_conv"], rc.probes["L0.state_conv"]  # [S, calls, C, K-1]
            per_call = np.abs(got - want).max(axis=(0, 2, 3))
            assert per_call[0] > 1e-2 and per_call.shape == (3,), (ref, per_call)
            # the first call's rows are right: the bug acts between calls
            rows = np.abs(cap.probes["L0.rec_conv"] - rc.probes["L0.rec_conv"]).max(axis=(0, 2))
            assert rows[:5].max() < 1e-5 and rows[5] > 1e-2, (ref, rows)
        st = all_statuses(run(policy, ref=HF_AND_LLAMACPP, **case))
    for ref in ("hf_cached", "llamacpp"):
        assert st[("impl", ref, 0, "state_conv")] == "fail"
    assert st[("impl", "hf", 0, "rec_conv")] == "fail"  # the full forward sees the rows it breaks


@pytest.mark.usefixtures("need_llamacpp")
def test_export_without_the_norm_offset_is_caught_at_attn_in(run, policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("qwen3_next"), "norm_plus_one", False)
    st = all_statuses(run(policy, family="qwen3_next", ref=HF_AND_LLAMACPP))
    assert st[("llamacpp", "hf", 0, "layer_in")] == "pass"
    assert st[("llamacpp", "hf", 0, "attn_in")] == "fail"  # the first (1 + w) norm
    assert st[("impl", "hf", 1, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 1, "attn_in")] == "fail"


def test_attention_bias_against_hf(run, policy):
    """HF-only setting (--set attention_bias=true): the double-width q bias rides with
    the gate, o_proj gets a bias; llama.cpp refuses the file (no attn_output.bias)."""
    rows = run(policy, family="qwen3_next", ref="hf", overrides=(("attention_bias", True),))
    feats = rows[0]["features"].split(";")
    assert "qkv_bias" in feats and "o_bias" in feats and "q_gate_interleaved" in feats
    assert {r["status"] for r in rows} == {"pass", "not-exposed"}
    assert {r["layer"] for r in rows if r["probe"] == "attn_out" and r["status"] == "pass"} == {0, 1, 2, 3}
