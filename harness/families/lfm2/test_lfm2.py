"""lfm2: the short-conv layers judged against HF, HF's cached path and llama.cpp,
their conv state at every call boundary (llama.cpp: from llama_state_seq_get_data,
the state is unnamed in lfm2.cpp); the attention layers with their per-head QK
norms; HF's conv bias is HF-only (lfm2.cpp has no slot for it); the file reads back."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv", ["decode", "paged"])
def test_short_conv_three_way(run, policy, kv):
    rows = run(policy, family="lfm2", ref=HF_AND_LLAMACPP, kv=kv, schedule="5,1,10")
    assert not [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]
    st = all_statuses(rows)
    for layer in (0, 2):
        assert {r["layer_kind"] for r in rows if r["layer"] == layer} == {"short_conv"}
        for ref in ("hf", "hf_cached"):
            for probe in ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "attn_branch", "attn_out", "resid_mid"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        # lfm2.cpp names in_proj (C is rec_z), the conv's output and out_proj; not B * x nor C * conv
        for probe in ("attn_in", "rec_z", "rec_conv", "attn_out", "state_conv"):
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        for probe in ("rec_conv_in", "attn_branch"):
            assert st[("impl", "llamacpp", layer, probe)] == "not-exposed"
        assert st[("impl", "hf_cached", layer, "state_conv")] == "pass"
        assert st[("llamacpp", "hf_cached", layer, "state_conv")] == "pass"
    for ref in ("hf", "llamacpp"):
        for probe in ("q", "k", "attn_probs", "attn_heads", "attn_out"):
            assert st[("impl", ref, 1, probe)] == "pass", (ref, probe)


def test_conv_bias_against_hf(run, policy):
    """HF-only: conv_bias=true puts biases on in_proj, the conv and out_proj."""
    rows = run(policy, family="lfm2", ref="hf_cached", overrides=(("conv_bias", True),))
    feats = rows[0]["features"].split(";")
    assert {"conv_bias", "in_proj_bias", "out_proj_bias"} <= set(feats)
    assert {r["status"] for r in rows} == {"pass"}


@pytest.mark.usefixtures("need_llamacpp")
def test_conv_bias_is_refused_by_llamacpp(run, policy):
    rows = run(policy, family="lfm2", ref="llamacpp", overrides=(("conv_bias", True),))
    err = [r for r in rows if r["status"] == "error"]
    assert len(err) == 1 and err[0]["reference"] == "llamacpp"
