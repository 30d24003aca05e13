"""qwen3_next: the delta-net layers are listed as not implemented in impl and
still compared between the references; the converter's +1 on the (1 + w)
norms is what makes llama.cpp agree; the q/o biases of attention_bias=True
(HF-only: llama.cpp's qwen3next has no attn_output.bias slot) against HF."""

from __future__ import annotations

import pytest

from harness.testing import all_statuses, run

LINEAR_PROBES = ("layer_in", "attn_in", "attn_out", "resid_mid", "layer_out")


@pytest.mark.usefixtures("need_llamacpp")
def test_linear_layers_are_named_not_implemented_and_compared_between_references(policy):
    rows = run(policy, family="qwen3_next", ref="all", kv="batched")
    for ref in ("hf", "llamacpp"):
        ni = [r for r in rows if r["candidate"] == "impl" and r["reference"] == ref and r["status"] == "not-implemented"]
        assert sorted(r["layer"] for r in ni) == [0, 2]
        assert all(r["layer_kind"] == "linear_attention" and "linear_attention" in r["reason"] for r in ni)
    st = all_statuses(rows)
    for layer in (0, 2):
        for probe in LINEAR_PROBES:
            assert st[("llamacpp", "hf", layer, probe)] == "pass", (layer, probe)
    # the attention layers are compared probe by probe against both
    for ref in ("hf", "llamacpp"):
        for probe in ("q", "k", "v", "q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out"):
            assert st[("impl", ref, 1, probe)] == "pass" and st[("impl", ref, 3, probe)] == "pass"


@pytest.mark.usefixtures("need_llamacpp")
def test_export_without_the_norm_offset_is_caught_at_attn_in(policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("qwen3_next"), "norm_plus_one", False)
    st = all_statuses(run(policy, family="qwen3_next", ref="all"))
    assert st[("llamacpp", "hf", 0, "layer_in")] == "pass"
    assert st[("llamacpp", "hf", 0, "attn_in")] == "fail"  # the first (1 + w) norm
    assert st[("impl", "hf", 1, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 1, "attn_in")] == "fail"


def test_attention_bias_against_hf(policy):
    """HF-only setting (--set attention_bias=true): the double-width q bias rides with
    the gate, o_proj gets a bias; llama.cpp refuses the file (no attn_output.bias)."""
    rows = run(policy, family="qwen3_next", ref="hf", overrides=(("attention_bias", True),))
    feats = rows[0]["features"].split(";")
    assert "qkv_bias" in feats and "o_bias" in feats and "q_gate_interleaved" in feats
    assert {r["status"] for r in rows} == {"pass", "not-implemented"}
    assert {r["layer"] for r in rows if r["probe"] == "attn_out" and r["status"] == "pass"} == {1, 3}
