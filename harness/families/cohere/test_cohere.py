"""cohere (Command-R): the parallel block and interleaved RoPE three-way, and the
QK norms llama.cpp loads only at 64 layers or more -- both sides of that switch."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

QK = (("use_qk_norm", True),)
# 64 layers (the depth command-r.cpp creates the QK norms at), kept cheap: two heads of 16,
# six tokens, the first and the last layer compared
DEEP = (("num_hidden_layers", 64), ("hidden_size", 32), ("num_attention_heads", 2), ("num_key_value_heads", 1))


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way(run, policy, kv):
    rows = run(policy, family="cohere", ref=HF_AND_LLAMACPP, kv=kv)
    feats = set(rows[0]["features"].split(";"))
    assert {"parallel_residual", "layernorm", "rope_interleaved", "gqa"} <= feats
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed")]
    st = all_statuses(rows)
    assert st[("impl", "llamacpp", 0, "attn_out")] == "not-exposed"  # command-r.cpp: wo's product has no name
    assert st[("impl", "hf", 1, "attn_out")] == "pass"
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"  # logit_scale on both sides


def test_the_qk_norm_has_a_weight_per_head(case_run, policy):
    r = case_run(policy, "cohere", ref="hf", overrides=QK)
    lc = r.layer_cfgs[0]
    assert lc.qk_norm.per_head and lc.qk_norm.norm.kind == "layer"
    w = r.weights_for("float32")[0]
    assert w["q_norm"].shape == (4, 16) and w["k_norm"].shape == (2, 16)
    assert {"qk_norm_head", "qk_norm_per_head_weight"} <= set(r.features)


def test_qk_norms_below_64_layers_are_a_file_llamacpp_refuses(run, policy):
    """command-r.cpp creates attn_q_norm / attn_k_norm only at n_layer >= 64: with two
    layers the file's QK norms are tensors it has no slot for (the load fails, an error
    row, never a pass), while impl is held to HF."""
    rows = run(policy, family="cohere", ref=HF_AND_LLAMACPP, kv="paged", overrides=QK)
    st = all_statuses(rows)
    assert st[("impl", "hf", 0, "q_rope")] == "pass" and st[("impl", "hf", 1, "attn_out")] == "pass"
    errors = [r for r in rows if r["status"] == "error"]
    assert errors and "wrong number of tensors" in errors[0]["reason"]


@pytest.mark.parametrize("qk", [True, False], ids=["qk-norm", "no-qk-norm"])
def test_at_64_layers(run, policy, qk):
    """The other side of the switch: at 64 layers llama.cpp loads the QK norms and
    the three agree with them; without them (use_qk_norm false) too -- the file then
    carries none, which llama.cpp refuses at this depth, so that side is an error."""
    rows = run(policy, family="cohere", ref=HF_AND_LLAMACPP, kv="decode", tokens=6, layers="0,-1",
               overrides=DEEP + (("use_qk_norm", qk),))
    st = all_statuses(rows)
    assert st[("impl", "hf", 63, "q_rope")] == "pass"
    if qk:
        assert st[("impl", "llamacpp", 0, "q")] == "pass"
        assert st[("impl", "llamacpp", 63, "q_rope")] == "pass"
        assert st[("llamacpp", "hf", 63, "attn_probs")] == "pass"
        assert not [r for r in rows if r["status"] not in ("pass", "not-exposed")]
    else:
        errors = [r for r in rows if r["status"] == "error"]
        assert errors and "llama.cpp" in errors[0]["reason"]
