"""gemma: (1 + w) norms and the scaled embedding, verified against llama.cpp;
the converter's missing RoPE theta on both sides (10000 agrees, another is a
finding); the ref-vs-ref FFN finding pinned on ggml's fp16 GELU table; the
o_proj bias gemma.cpp has no tensor for judged against HF alone."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, llamacpp_statuses
from harness.testing.ggml_gelu import assert_fp16_gelu_explains_layer_out

pytestmark = pytest.mark.usefixtures("need_llamacpp")

THETA_1E5 = (("rope_parameters.rope_theta", 100000.0),)


def test_the_one_in_one_plus_w_is_checked_against_llamacpp(run, policy):
    with applied(registry()["rms1p-drops-the-one"]):
        st = all_statuses(run(policy, family="gemma", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "fail"


def test_theta_10000_agrees_and_another_is_a_finding(run, policy):
    st = all_statuses(run(policy, family="gemma", ref=HF_AND_LLAMACPP, kv="paged", overrides=(("num_key_value_heads", 1),)))
    assert all(s == "pass" for (c, _, _, _), s in st.items() if c == "impl")
    lc = llamacpp_statuses(run(policy, family="gemma", ref=HF_AND_LLAMACPP, kv="paged", overrides=THETA_1E5))
    assert lc[(0, "q")] == "pass" and lc[(0, "q_rope")] == lc[(1, "attn_probs")] == "finding"


def test_ffn_finding_is_the_fp16_gelu_table(case_run, policy):
    r = case_run(policy, "gemma", ref=HF_AND_LLAMACPP, kv="decode")
    layer = get("gemma").decoder_layers(r.base_model)[0]

    def ffn_half(x, act):
        h = layer.post_attention_layernorm(x)
        return x + layer.mlp.down_proj(act(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))

    assert_fp16_gelu_explains_layer_out(r.capture("llamacpp").probes, ffn_half, layer.mlp.act_fn)


def test_attention_bias_is_hf_only(run, policy):
    over = (("attention_bias", True),)
    rows = run(policy, family="gemma", ref="hf", kv="paged", overrides=over)
    assert all(r["status"] == "pass" for r in rows)
    rows = run(policy, family="gemma", ref="llamacpp", kv="paged", overrides=over)
    assert [r["status"] for r in rows] == ["error"]
