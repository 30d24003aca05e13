"""cohere2: parallel block, NoPE full layers, interleaved RoPE on sliding ones,
and the window pattern written where llama.cpp reads it."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_parallel_block_and_nope_full_layers(run, policy):
    rows = run(policy, family="cohere2", ref=HF_AND_LLAMACPP)
    feats = set(rows[0]["features"].split(";"))
    assert {"parallel_residual", "layernorm", "rope_interleaved", "nope_layers", "sliding_window"} <= feats
    st = all_statuses(rows)
    # a parallel block has no residual between attention and FFN: nobody reports one
    assert not [k for k in st if k[3] == "resid_mid"]
    for layer in range(4):  # sliding (RoPE'd) and full (NoPE) layers alike
        for ref in ("hf", "llamacpp"):
            assert st[("impl", ref, layer, "q_rope")] == "pass"
            assert st[("impl", ref, layer, "attn_probs")] == "pass"
        assert st[("impl", "hf", layer, "attn_out")] == "pass"
        assert st[("impl", "llamacpp", layer, "attn_out")] == "not-exposed"  # wo's product has no name
        assert st[("llamacpp", "hf", layer, "layer_out")] == "pass"
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"  # logit_scale on both sides


def test_swa_pattern_must_reach_llamacpp(run, policy, monkeypatch):
    """Without the bool-array pattern (the converter writes none), llama.cpp's default 4
    makes layer 1 -- full and NoPE in HF with pattern 2 -- sliding AND rotated."""
    from harness.families import get

    monkeypatch.setattr(get("cohere2"), "_write_swa_pattern", False)
    st = all_statuses(run(policy, family="cohere2", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "pass"
    assert st[("impl", "llamacpp", 1, "q")] == "pass"
    assert st[("impl", "llamacpp", 1, "q_rope")] == "fail"


@pytest.mark.parametrize("family", ["cohere2", "cohere2_moe"])
def test_an_attention_bias_is_refused_for_llamacpp_in_one_line_and_runs_against_hf(run, policy, family):
    """The converter drops only all-zero biases and raises on any other (command_r.py
    Cohere2Model.modify_tensors): a seeded bias reached the export as a traceback before;
    now llama.cpp refuses it up front, in one line, and HF and impl still run it."""
    from harness.families import get

    fam = get(family)
    why = fam.lc_refusal(fam.make_config({"attention_bias": True}))
    assert why and "attention_bias=true" in why and "valid" in why and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None
    rows = run(policy, family=family, ref="hf", tokens=4, overrides=(("attention_bias", True),))
    assert {r["status"] for r in rows} <= {"pass", "not-exposed", "finding"} and rows
