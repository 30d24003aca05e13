"""internlm3: llama with its own head_dim and one bias switch for attention and
MLP -- three-way with every bias on and with a head_dim other than hidden /
heads (the file's key_length), and the converter's Q/K permutation shown to
matter."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_fails_first_at_q

pytestmark = pytest.mark.usefixtures("need_llamacpp")

BIASES = (("attention_bias", True), ("mlp_bias", True))


@pytest.mark.parametrize("overrides", [BIASES, (("head_dim", 8),)], ids=["biases", "head_dim-8"])
def test_three_way(run, policy, overrides):
    rows = run(policy, family="internlm3", ref=HF_AND_LLAMACPP, kv="paged", overrides=overrides)
    st = all_statuses(rows)
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    feats = set(rows[0]["features"].split(";"))
    assert ({"qkv_bias", "o_bias"} <= feats) == (overrides == BIASES)


def test_unequal_bias_switches_are_bad_input(policy):
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="qkv_bias"):
        get("internlm3").make_config({"attention_bias": True})


def test_without_the_permutation_llamacpp_differs_at_q(run, policy, monkeypatch):
    monkeypatch.setattr(get("internlm3"), "_permute_qk", False)
    assert_llamacpp_fails_first_at_q(all_statuses(run(policy, family="internlm3", ref=HF_AND_LLAMACPP)))
