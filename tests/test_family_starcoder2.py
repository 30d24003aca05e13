"""starcoder2 specifics: LayerNorm with bias and biases everywhere; the o_proj
output not exposed by llama.cpp; the HF-only sliding window (a finding against
llama.cpp); the ref-vs-ref FFN finding pinned on ggml's fp16 GELU table."""

from __future__ import annotations

import torch

from conftest import run, statuses
from harness.families import get
from harness.families.starcoder2 import WINDOW_4
from harness.mutants import registry
from helpers.ggml_gelu import gelu_fp16_table, max_diff


def _case_run(policy, **kw):
    from harness.case import Case, CaseRun

    return CaseRun(Case(family="starcoder2", **kw), policy)


def test_tiny_config_exercises_its_decorations(policy):
    r = _case_run(policy, ref="hf")
    assert {"layernorm", "o_bias", "qkv_bias"} <= set(r.features)
    assert "sliding_window" not in r.features
    w = r.weights_for("float32")[0]
    assert {"attn_norm_b", "bq", "bk", "bv", "bo"} <= set(w)


def test_every_decoration_has_a_mutant(policy):
    covered = {m.decoration for m in registry().values()}
    for overrides in ((), WINDOW_4):
        feats = set(_case_run(policy, ref="hf", overrides=overrides).features) - {"kv_decode"}
        assert feats <= covered, feats - covered


def test_window_passes_against_hf_and_is_a_finding_against_llamacpp(policy, need_llamacpp):
    rows = run(policy, family="starcoder2", ref="all", kv="decode", overrides=WINDOW_4)
    st = statuses(rows)
    hf = {k: v for k, v in st.items() if k[0] == "hf"}
    assert hf and all(v == "pass" for v in hf.values()), hf
    lc = {(layer, probe): v for (ref, layer, probe), v in st.items() if ref == "llamacpp"}
    # every layer is windowed in HF; llama.cpp attends causally over everything
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"
    # starcoder2.cpp names no o_proj output: reported, never faked
    assert lc[(0, "attn_out")] == "not-exposed"
    assert not [r for r in rows if r["status"] in ("fail", "error")]


def test_ffn_finding_is_the_fp16_gelu_table(policy, need_llamacpp):
    """HF's FFN half with ggml's fp16 GELU table, on llama.cpp's resid_mid,
    reproduces llama.cpp's layer_out; with HF's exact GELU it does not."""
    r = _case_run(policy, ref="all", kv="decode")
    lc = r.capture("llamacpp").probes
    layer = get("starcoder2").decoder_layers(r.base_model)[0]

    def ffn_half(act):
        with torch.no_grad():
            x = torch.as_tensor(lc["L0.resid_mid"], dtype=torch.float32)
            return (x + layer.mlp.c_proj(act(layer.mlp.c_fc(layer.post_attention_layernorm(x))))).numpy()

    exact = max_diff(ffn_half(layer.mlp.act), lc["L0.layer_out"])
    table = max_diff(ffn_half(gelu_fp16_table), lc["L0.layer_out"])
    assert exact > 1e-4 and table < 1e-5, (exact, table)
