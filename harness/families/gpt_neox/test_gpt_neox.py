"""gpt_neox: the per-head interleaved fused QKV and its reorder, partial RoPE whose
width the converter writes from a key transformers 5 no longer saves, the RoPE base
it does not write at all, and both residual layouts."""

from __future__ import annotations

import json

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def _attention_passes(rows):
    bad = [r for r in rows if r["status"] not in ("pass", "not-exposed", "finding")]
    assert not bad, bad[:3]


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_three_way(run, policy, kv, parallel):
    rows = run(policy, family="gpt_neox", ref=HF_AND_LLAMACPP, kv=kv, overrides=(("use_parallel_residual", parallel),))
    feats = set(rows[0]["features"].split(";"))
    assert {"qkv_bias", "o_bias", "partial_rotary", "layernorm", "rope_neox"} <= feats
    assert ("parallel_residual" in feats) == parallel
    _attention_passes(rows)
    st = all_statuses(rows)
    for layer in (0, 1):
        for ref in ("hf", "llamacpp"):
            assert st[("impl", ref, layer, "attn_branch")] == "pass"
        assert st[("impl", "hf", layer, "attn_out")] == "pass"
        if not parallel:  # gptneox.cpp names ffn_inp only in the sequential block
            assert st[("impl", "llamacpp", layer, "resid_mid")] == "pass"
    # the attention of layer 0 agrees between the references; the FFN (erf gelu vs
    # ggml's tanh table) is the finding from L0 layer_out on
    assert st[("llamacpp", "hf", 0, "attn_branch")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"


def test_the_converter_reads_rotary_pct_which_transformers5_no_longer_saves(case_run, policy, tmp_path):
    """conversion/gptneox.py reads hparams["rotary_pct"]; a transformers-5 config.json
    has partial_rotary_factor in rope_parameters instead (the converter would stop
    on a KeyError). The export writes what the key means."""
    r = case_run(policy, "gpt_neox", ref="hf")
    r.config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rotary_pct" not in saved and saved["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert r.layer_cfgs[0].rope.rotary_dim == 4  # 0.25 x head_size 16


@pytest.mark.parametrize("from_config,expect", [(True, "pass"), (False, "fail")], ids=["rotary-pct", "whole-head"])
def test_the_rotary_width_must_reach_llamacpp(run, policy, monkeypatch, from_config, expect):
    """Both sides: rope.dimension_count from partial_rotary_factor passes; the whole head
    (what a converter falling back to 1.0 would write) rotates channels HF leaves alone."""
    monkeypatch.setattr(get("gpt_neox"), "_rotary_from_config", from_config)
    st = all_statuses(run(policy, family="gpt_neox", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == expect


@pytest.mark.parametrize("theta,expect", [(10000.0, "pass"), (100000.0, "finding")])
def test_no_theta_key(run, policy, theta, expect):
    """The converter writes no rope.freq_base: at HF's default 10000 the references
    agree; any other rope_theta is rotated at 10000 by llama.cpp (a finding)."""
    st = all_statuses(run(policy, family="gpt_neox", ref=HF_AND_LLAMACPP, kv="decode",
                          overrides=(("rope_parameters.rope_theta", theta),)))
    assert st[("impl", "hf", 0, "q_rope")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == expect
    assert st[("llamacpp", "hf", 0, "q_rope")] == expect


def test_qkv_reorder_must_reach_llamacpp(run, policy, monkeypatch):
    """Without the converter's per-head -> [Q; K; V] reorder llama.cpp reads the
    wrong rows: q fails at once."""
    monkeypatch.setattr(get("gpt_neox"), "_reorder_qkv", False)
    st = all_statuses(run(policy, family="gpt_neox", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "fail"
