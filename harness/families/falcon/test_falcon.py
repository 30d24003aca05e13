"""falcon: the fused QKV in KV groups in its three forms (multi-query, the new
architecture's groups with two norms, the old multi-head form), the converter's
fixed context and the KV head count it reads from a saved config, no theta key."""

from __future__ import annotations

import json

import pytest

from harness.families import get
from harness.families.falcon import CONVERTER_CONTEXT
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

NEW_ARCH = (("new_decoder_architecture", True), ("num_kv_heads", 2))
MHA = (("multi_query", False),)


def _attention_passes(rows):
    bad = [r for r in rows if r["status"] not in ("pass", "not-exposed", "finding")]
    assert not bad, bad[:3]
    st = all_statuses(rows)
    for layer in (0, 1):
        for ref in ("hf", "llamacpp"):
            assert st[("impl", ref, layer, "attn_branch")] == "pass"
        assert st[("impl", "hf", layer, "attn_out")] == "pass"
        assert st[("impl", "llamacpp", layer, "attn_out")] == "not-exposed"  # falcon.cpp: no name for wo's product
    assert st[("llamacpp", "hf", 0, "attn_branch")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"  # the FFN's GELU (findings.toml)
    return st


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_multi_query_three_way(run, policy, kv):
    rows = run(policy, family="falcon", ref=HF_AND_LLAMACPP, kv=kv)
    assert {"mqa", "layernorm", "parallel_residual", "rope_neox"} <= set(rows[0]["features"].split(";"))
    _attention_passes(rows)


@pytest.mark.parametrize("overrides,kv_heads", [(NEW_ARCH, 2), (MHA, 4)], ids=["new-architecture", "multi-head"])
def test_other_qkv_forms_three_way(case_run, run, policy, overrides, kv_heads):
    r = case_run(policy, "falcon", ref="hf", overrides=overrides)
    assert r.layer_cfgs[0].n_kv_heads == kv_heads
    _attention_passes(run(policy, family="falcon", ref=HF_AND_LLAMACPP, kv="paged", overrides=overrides))


def test_the_saved_config_says_n_head_kv_heads_under_multi_query(case_run, run, policy, tmp_path, monkeypatch):
    """FalconConfig.__post_init__ sets num_kv_heads = n_head even under multi_query
    (where the attention uses one): the converter reads it from the saved config.json
    and writes head_count_kv = n_head, a file llama.cpp refuses (wqkv is n_embd +
    2 * head_dim wide, not n_embd + 2 * n_embd). The export writes the one head the
    attention uses."""
    r = case_run(policy, "falcon", ref="hf")
    r.config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["multi_query"] and saved["num_kv_heads"] == saved["num_attention_heads"] == 4
    monkeypatch.setattr(get("falcon"), "_kv_heads_from_saved_config", True)
    rows = run(policy, family="falcon", ref="llamacpp", kv="decode")
    assert {r["status"] for r in rows} == {"error"} and "llama.cpp" in rows[0]["reason"]


@pytest.mark.parametrize("max_pos", [256, 2048])
def test_the_converter_writes_context_2048(case_run, gguf_export, run, policy, max_pos):
    """conversion/falcon.py writes context_length 2048 whatever the config says; with
    no RoPE scaling it changes no arithmetic, at either side of it."""
    import gguf


    ov = (("max_position_embeddings", max_pos),)
    r = case_run(policy, "falcon", ref="hf", overrides=ov)
    rd = gguf.GGUFReader(str(gguf_export.export(r.family, r.base_model, r.config, "f32", 0, None)))
    assert int(rd.fields["falcon.context_length"].parts[-1][0]) == CONVERTER_CONTEXT
    _attention_passes(run(policy, family="falcon", ref=HF_AND_LLAMACPP, kv="decode", overrides=ov))


@pytest.mark.parametrize("theta,expect", [(10000.0, "pass"), (100000.0, "finding")])
def test_no_theta_key(run, policy, theta, expect):
    st = all_statuses(run(policy, family="falcon", ref=HF_AND_LLAMACPP, kv="decode",
                          overrides=(("rope_parameters.rope_theta", theta),)))
    assert st[("impl", "hf", 0, "q_rope")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == expect
    assert st[("llamacpp", "hf", 0, "q_rope")] == expect


def test_qkv_reorder_must_reach_llamacpp(run, policy, monkeypatch):
    monkeypatch.setattr(get("falcon"), "_reorder_qkv", False)
    st = all_statuses(run(policy, family="falcon", ref="llamacpp", kv="decode", overrides=NEW_ARCH))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "fail"
