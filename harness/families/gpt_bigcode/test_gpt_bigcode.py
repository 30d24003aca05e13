"""gpt_bigcode: multi-query attention three-way; the multi-head form is a file
llama.cpp refuses (the converter writes head_count_kv = 1 and keeps HF's per-head
layout), judged against HF."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_multi_query_three_way(run, policy, kv):
    rows = run(policy, family="gpt_bigcode", ref=HF_AND_LLAMACPP, kv=kv)
    assert {"mqa", "qkv_bias", "o_bias", "layernorm"} <= set(rows[0]["features"].split(";"))
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed", "finding")]
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 1, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"  # the FFN's fp16 gelu table


def test_head_count_kv_is_hard_coded_1(run, policy):
    """Both sides of the converter's head_count_kv = 1: multi-query passes (above);
    multi-head (per-head interleaved c_attn, 3 * n_embd rows) passes against HF and
    is a file llama.cpp refuses (wqkv has the wrong shape for one KV head)."""
    rows = run(policy, family="gpt_bigcode", ref=HF_AND_LLAMACPP, kv="paged", overrides=(("multi_query", False),))
    st = all_statuses(rows)
    assert st[("impl", "hf", 0, "q")] == "pass" and st[("impl", "hf", 1, "resid_mid")] == "pass"
    errors = [r for r in rows if r["status"] == "error"]
    assert errors and "wrong shape" in errors[0]["reason"]
