"""starcoder2 specifics: LayerNorm with bias and biases everywhere; the o_proj
output not exposed by llama.cpp; the HF-only sliding window (a finding against
llama.cpp); the ref-vs-ref FFN finding pinned on ggml's fp16 GELU table."""

from __future__ import annotations

from harness.testing import HF_AND_LLAMACPP, llamacpp_statuses
from harness.families import get
from harness.families.starcoder2 import WINDOW_4
from harness.mutants import registry
from harness.testing.ggml_gelu import assert_fp16_gelu_explains_layer_out


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "starcoder2", ref="hf")
    assert {"layernorm", "o_bias", "qkv_bias"} <= set(r.features)
    assert "sliding_window" not in r.features
    w = r.weights_for("float32")[0]
    assert {"attn_norm_b", "bq", "bk", "bv", "bo"} <= set(w)


def test_every_decoration_has_a_mutant(case_run, policy):
    covered = {m.decoration for m in registry().values()}
    for overrides in ((), WINDOW_4):
        feats = set(case_run(policy, "starcoder2", ref="hf", overrides=overrides).features) - {"kv_decode"}
        assert feats <= covered, feats - covered


def test_window_passes_against_hf_and_is_a_finding_against_llamacpp(run, policy, need_llamacpp):
    rows = run(policy, family="starcoder2", ref=HF_AND_LLAMACPP, kv="decode", overrides=WINDOW_4)
    lc = llamacpp_statuses(rows)
    # every layer is windowed in HF; llama.cpp attends causally over everything
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"
    # starcoder2.cpp names no o_proj output: derived as ffn_inp - layer_in, and said so --
    # downstream of the missing window it disagrees like every other probe: the finding
    assert lc[(0, "attn_out")] == "finding"
    row = next(r for r in rows if (r["candidate"], r["reference"], r["layer"], r["probe"])
               == ("impl", "llamacpp", 0, "attn_out"))
    assert "derived as ffn_inp - layer_in" in row["reason"]


def test_ffn_finding_is_the_fp16_gelu_table(case_run, policy, need_llamacpp):
    """HF's FFN half with ggml's fp16 GELU table, on llama.cpp's resid_mid,
    reproduces llama.cpp's layer_out; with HF's exact GELU it does not."""
    r = case_run(policy, "starcoder2", ref=HF_AND_LLAMACPP, kv="decode")
    layer = get("starcoder2").decoder_layers(r.base_model)[0]

    def ffn_half(x, act):
        return x + layer.mlp.c_proj(act(layer.mlp.c_fc(layer.post_attention_layernorm(x))))

    assert_fp16_gelu_explains_layer_out(r.capture("llamacpp").probes, ffn_half, layer.mlp.act)
