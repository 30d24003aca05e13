"""stablelm: per-head QK LayerNorms (stacked by the converter), partial RoPE, QKV
biases, both block forms -- the parallel one llama.cpp infers from the missing
ffn_norm, not from the use_parallel_residual key the converter writes."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

PARALLEL = (("use_parallel_residual", True),)


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
@pytest.mark.parametrize("overrides", [(), PARALLEL], ids=["sequential", "parallel"])
def test_three_way(run, policy, kv, overrides):
    rows = run(policy, family="stablelm", ref=HF_AND_LLAMACPP, kv=kv, overrides=overrides)
    feats = set(rows[0]["features"].split(";"))
    assert {"qk_norm_head", "qk_norm_per_head_weight", "qkv_bias", "partial_rotary", "layernorm"} <= feats
    assert ("parallel_residual" in feats) == bool(overrides)
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed")]
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 1, "q_rope")] == "pass"


def test_without_qk_norms_or_biases(run, policy):
    ov = (("qk_layernorm", False), ("use_qkv_bias", False))
    rows = run(policy, family="stablelm", ref=HF_AND_LLAMACPP, kv="paged", overrides=ov)
    assert "qk_norm_head" not in rows[0]["features"] and "qkv_bias" not in rows[0]["features"]
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed")]


def test_the_file_stacks_the_per_head_norms(case_run, policy):
    """StableLMModel._stack_qk_norm: norms.{h}.weight -> row h of attn_q_norm [n_head, head_dim]."""
    r = case_run(policy, "stablelm", ref="hf")
    names = dict(r.family.gguf_tensors(r.base_model, r.config))
    qn = r.base_model.model.layers[1].self_attn.q_layernorm.norms
    assert names["blk.1.attn_q_norm.weight"].shape == (4, 16) and names["blk.1.attn_k_norm.weight"].shape == (2, 16)
    for h in range(4):
        np.testing.assert_array_equal(names["blk.1.attn_q_norm.weight"][h], qn[h].weight.detach().numpy())
    assert not [n for n in names if "#" in n]


@pytest.mark.parametrize("name", ["qk-norm-heads-reversed", "qk-norm-per-head-weight-of-head-0"])
def test_a_broken_per_head_weight_fails_against_both(run, policy, name):
    m = registry()[name]
    with applied(m):
        st = all_statuses(run(policy, family="stablelm", ref=HF_AND_LLAMACPP, kv="paged"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q")] == "pass"
        assert st[("impl", ref, 0, m.first_probe)] == "fail"


def test_llamacpp_reads_the_block_form_from_the_tensors_not_the_key(case_run, gguf_export, run, policy, monkeypatch):
    """The converter writes use_parallel_residual; stablelm.cpp never reads it (the
    block is parallel iff there is no ffn_norm): a file whose key says the opposite
    still computes HF's parallel block."""
    import gguf

    from harness.families import get

    monkeypatch.setattr(get("stablelm"), "_invert_parallel_residual_key", True)
    r = case_run(policy, "stablelm", ref="hf", overrides=PARALLEL)
    rd = gguf.GGUFReader(str(gguf_export.export(r.family, r.base_model, r.config, "f32", 0, None)))
    assert not bool(rd.fields["stablelm.use_parallel_residual"].parts[-1][0])  # the key says sequential
    rows = run(policy, family="stablelm", ref=HF_AND_LLAMACPP, kv="paged", overrides=PARALLEL)
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed")]
