"""arcee: llama's attention on llama.cpp's arcee graph -- the converter's
permutation shown to matter, and attention_bias (an o_proj bias arcee.cpp has
no tensor for) judged against HF alone, refused by llama.cpp."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_fails_first_at_q

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_without_the_permutation_llamacpp_differs_at_q(run, policy, monkeypatch):
    monkeypatch.setattr(get("arcee"), "_permute_qk", False)
    assert_llamacpp_fails_first_at_q(all_statuses(run(policy, family="arcee", ref=HF_AND_LLAMACPP)))


def test_attention_bias_is_hf_only(run, policy):
    rows = run(policy, family="arcee", ref="hf", kv="paged", overrides=(("attention_bias", True),))
    assert {"o_bias", "qkv_bias"} <= set(rows[0]["features"].split(";"))
    assert all(r["status"] == "pass" for r in rows)
    rows = run(policy, family="arcee", ref="llamacpp", kv="paged", overrides=(("attention_bias", True),))
    assert [r["status"] for r in rows] == ["error"]
    assert "wrong number of tensors" in rows[0]["reason"]
