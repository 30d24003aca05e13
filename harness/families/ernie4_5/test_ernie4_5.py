"""ernie4_5: interleaved RoPE over the whole head, verified against llama.cpp
(a neox rotation fails there); use_bias (MLP biases ernie4-5.cpp has no
tensors for) judged against HF alone; bfloat16, where HF rotates in float32."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_a_neox_rotation_fails_against_llamacpp(run, policy):
    with applied(registry()["rope-layout-swapped"]):
        st = all_statuses(run(policy, family="ernie4_5", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"


def test_use_bias_is_hf_only(run, policy):
    over = (("use_bias", True),)
    rows = run(policy, family="ernie4_5", ref="hf", kv="paged", overrides=over)
    assert {"o_bias", "qkv_bias"} <= set(rows[0]["features"].split(";"))
    assert all(r["status"] == "pass" for r in rows)
    rows = run(policy, family="ernie4_5", ref="llamacpp", kv="paged", overrides=over)
    assert [r["status"] for r in rows] == ["error"]


def test_bfloat16_against_hf_which_rotates_in_float32(run, policy):
    rows = run(policy, family="ernie4_5", ref="hf", backend="torch", dtype="bfloat16", kv="paged")
    st = all_statuses(rows)
    assert st[("impl", "hf", 1, "q_rope")] == "pass" and all(s == "pass" for s in st.values())
