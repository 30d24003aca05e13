"""qwen3_5_text: the delta-net layers three-way, llama.cpp's value heads tiled
(the converter's V-head reorder, which is what makes llama.cpp agree there) put
back in HF's grouped order; the MRoPE sections must fit the head (the HF
default aborts llama.cpp at head_dim 16) while HF ignores them for text."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_export_without_the_v_head_reorder_is_caught_at_the_delta_net_output(run, policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("qwen3_5_text"), "_reorder_v_heads", False)
    st = all_statuses(run(policy, family="qwen3_5_text", ref=HF_AND_LLAMACPP))
    assert st[("llamacpp", "hf", 0, "attn_in")] == "pass"
    assert st[("llamacpp", "hf", 0, "rec_v")] == "pass"  # v before the recurrence: the heads' order only
    assert st[("llamacpp", "hf", 0, "rec_out")] == "fail"  # layer 0 is a delta-net layer
    assert st[("llamacpp", "hf", 0, "attn_out")] == "fail"
    # impl is teacher-forced from llama.cpp's own layer input, so its attention layers still agree
    assert st[("impl", "llamacpp", 1, "attn_branch")] == "pass"
    assert st[("impl", "hf", 1, "attn_branch")] == "pass"


def test_default_mrope_sections_abort_llamacpp_at_this_head_dim(run, policy):
    """HF's default mrope_section [11, 11, 10] sums past head_dim 16: ggml's CPU rope
    asserts sum(sections) <= head_dim; HF ignores the sections for text."""
    rows = run(policy, family="qwen3_5_text", ref=HF_AND_LLAMACPP, overrides=(("rope_parameters.mrope_section", [11, 11, 10]),))
    impl_hf = [r for r in rows if r["candidate"] == "impl" and r["reference"] == "hf"]
    assert {r["status"] for r in impl_hf} == {"pass", "not-exposed"}  # not-exposed: the states (HF's full forward)
    err = [r for r in rows if r["status"] == "error"]
    assert len(err) == 1 and err[0]["reference"] == "llamacpp" and "signal 6" in err[0]["reason"]  # abort()


def test_delta_net_three_way_with_tiled_heads_put_back(run, policy):
    rows = run(policy, family="qwen3_5_text", ref=HF_AND_LLAMACPP, kv="paged")
    assert not [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]
    st = all_statuses(rows)
    for ref in ("hf", "hf_cached", "llamacpp"):
        for probe in ("rec_conv", "rec_z", "rec_q", "rec_v", "rec_beta", "rec_decay", "rec_out", "attn_branch"):
            assert st[("impl", ref, 0, probe)] == "pass", (ref, probe)  # qwen35.cpp names beta_sigmoid
    for probe in ("state_conv", "state_rec"):  # the tiled V channels / heads of llama.cpp's state, grouped again
        assert st[("impl", "llamacpp", 2, probe)] == "pass" and st[("llamacpp", "hf_cached", 2, probe)] == "pass"
