"""phi (phi-2): the parallel block with all its biases three-way, the QK LayerNorm
with a bias (HF-only: llama.cpp's phi2 graph has no slot), and the converter's
fixed MHA / 4x FFN / missing theta."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

QK = (("qk_layernorm", True),)


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way(run, policy, kv):
    rows = run(policy, family="phi", ref=HF_AND_LLAMACPP, kv=kv)
    feats = set(rows[0]["features"].split(";"))
    assert {"qkv_bias", "o_bias", "partial_rotary", "layernorm", "parallel_residual"} <= feats
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed", "finding")]
    st = all_statuses(rows)
    for layer in (0, 1):
        for ref in ("hf", "llamacpp"):
            assert st[("impl", ref, layer, "attn_branch")] == "pass"
        assert st[("impl", "hf", layer, "attn_out")] == "pass"
    assert st[("llamacpp", "hf", 0, "attn_branch")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"  # the FFN's fp16 gelu table (findings.toml)


def test_the_qk_layernorm_with_a_bias_against_hf(case_run, run, policy):
    r = case_run(policy, "phi", ref="hf", overrides=QK)
    assert {"qk_norm_head", "qk_norm_bias"} <= set(r.features)
    w = r.weights_for("float32")[0]
    assert w["q_norm"].shape == w["q_norm_b"].shape == (16,)  # one LayerNorm(head_dim) for every head
    rows = run(policy, family="phi", ref="hf", kv="paged", overrides=QK)
    assert rows and all(r["status"] == "pass" for r in rows)


def test_the_qk_layernorm_has_no_place_in_llamacpp(run, policy):
    """phi2.cpp loads no attn_q_norm: the export refuses the tensors (an error row), never a pass."""
    rows = run(policy, family="phi", ref="llamacpp", kv="decode", overrides=QK)
    assert {r["status"] for r in rows} == {"error"} and "qk_layernorm is HF-only" in rows[0]["reason"]


def test_a_dropped_qk_norm_bias_fails_against_hf(run, policy):
    with applied(registry()["qk-norm-bias-dropped"]):
        st = all_statuses(run(policy, family="phi", ref="hf", kv="paged", overrides=QK))
    assert st[("impl", "hf", 0, "q")] == "pass"
    assert st[("impl", "hf", 0, "q_rope")] == "fail"


@pytest.mark.parametrize("theta,expect", [(10000.0, "pass"), (100000.0, "finding")])
def test_no_theta_key(run, policy, theta, expect):
    st = all_statuses(run(policy, family="phi", ref=HF_AND_LLAMACPP, kv="decode",
                          overrides=(("rope_parameters.rope_theta", theta),)))
    assert st[("impl", "hf", 0, "q_rope")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == expect
    assert st[("llamacpp", "hf", 0, "q_rope")] == expect


@pytest.mark.parametrize("overrides", [(("num_key_value_heads", 2),), (("intermediate_size", 96),)],
                         ids=["gqa", "ffn-not-4x"])
def test_the_converter_writes_mha_and_a_4x_ffn(run, policy, overrides):
    """Phi2Model writes head_count_kv = n_head and feed_forward_length = 4 * n_embd
    whatever the config says: a GQA or a non-4x checkpoint is a file llama.cpp
    refuses (error rows), while impl is held to HF."""
    rows = run(policy, family="phi", ref=HF_AND_LLAMACPP, kv="decode", overrides=overrides)
    st = all_statuses(rows)
    assert st[("impl", "hf", 1, "attn_out")] == "pass"
    assert [r for r in rows if r["status"] == "error"]
