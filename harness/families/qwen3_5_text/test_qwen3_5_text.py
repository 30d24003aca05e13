"""qwen3_5_text: the converter's V-head reorder of the delta-net layers is what
makes llama.cpp agree there; the MRoPE sections must fit the head (the HF
default aborts llama.cpp at head_dim 16) while HF ignores them for text."""

from __future__ import annotations

import pytest

from harness.testing import all_statuses, run

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_export_without_the_v_head_reorder_is_caught_at_the_delta_net_output(policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("qwen3_5_text"), "reorder_v_heads", False)
    st = all_statuses(run(policy, family="qwen3_5_text", ref="all"))
    assert st[("llamacpp", "hf", 0, "attn_in")] == "pass"
    assert st[("llamacpp", "hf", 0, "attn_out")] == "fail"  # layer 0 is a delta-net layer
    # impl is teacher-forced from llama.cpp's own layer input, so its attention layers still agree
    assert st[("impl", "llamacpp", 1, "attn_branch")] == "pass"
    assert st[("impl", "hf", 1, "attn_branch")] == "pass"


def test_default_mrope_sections_abort_llamacpp_at_this_head_dim(policy):
    """HF's default mrope_section [11, 11, 10] sums past head_dim 16: ggml's CPU rope
    asserts sum(sections) <= head_dim; HF ignores the sections for text."""
    rows = run(policy, family="qwen3_5_text", ref="all", overrides=(("rope_parameters.mrope_section", [11, 11, 10]),))
    impl_hf = [r for r in rows if r["candidate"] == "impl" and r["reference"] == "hf"]
    assert {r["status"] for r in impl_hf} == {"pass", "not-implemented"}
    err = [r for r in rows if r["status"] == "error"]
    assert len(err) == 1 and err[0]["reference"] == "llamacpp" and "signal 6" in err[0]["reason"]  # abort()
