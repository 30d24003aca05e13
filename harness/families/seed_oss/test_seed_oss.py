"""seed_oss: q/k/v biases without an o_proj bias, verified against llama.cpp
(a dropped bias fails there as against HF); attention_out_bias (no tensor in
seed-oss.cpp) is judged against HF alone."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_a_dropped_qkv_bias_fails_against_both(run, policy):
    with applied(registry()["qkv-bias-dropped"]):
        st = all_statuses(run(policy, family="seed_oss", ref=HF_AND_LLAMACPP))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "attn_in")] == "pass" and st[("impl", ref, 0, "q")] == "fail"


def test_attention_out_bias_is_hf_only(run, policy):
    over = (("attention_out_bias", True),)
    rows = run(policy, family="seed_oss", ref="hf", kv="paged", overrides=over)
    assert {"o_bias", "qkv_bias"} <= set(rows[0]["features"].split(";"))
    assert all(r["status"] == "pass" for r in rows)
    rows = run(policy, family="seed_oss", ref="llamacpp", kv="paged", overrides=over)
    assert [r["status"] for r in rows] == ["error"]
    assert "wrong number of tensors" in rows[0]["reason"]
