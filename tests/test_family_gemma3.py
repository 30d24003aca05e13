"""gemma3: what only gemma3 brings -- local/global theta and window written
where llama.cpp reads them, and the HF-only query_pre_attn_scalar."""

from __future__ import annotations

import pytest

from conftest import run

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def _st(rows):
    return {(r["candidate"], r["reference"], r["layer"], r["probe"]): r["status"] for r in rows}


def test_default_config_decorations_are_on(policy):
    rows = run(policy, family="gemma3", ref="hf")
    feats = set(rows[0]["features"].split(";"))
    assert {"rms1p", "qk_norm_head", "post_norm", "per_layer_theta", "sliding_window", "rope_neox"} <= feats
    assert "attn_scale" not in feats  # query_pre_attn_scalar == head_dim: both references agree


def test_gelu_table_is_a_finding_not_a_failure(policy):
    """llama.cpp's fp16 GELU table makes layer_out differ from HF (the MLP half);
    impl, teacher-forced, still passes against both on every probe."""
    rows = run(policy, family="gemma3", ref="all")
    st = _st(rows)
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass"  # layer 0's attention agrees
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"
    assert all(s == "pass" for (c, ref, _, p), s in st.items() if c == "impl" and p != "*")


def test_hf_only_query_pre_attn_scalar(policy):
    """HF scales by query_pre_attn_scalar ** -0.5; llama.cpp by 1/sqrt(head_dim)."""
    rows = run(policy, family="gemma3", ref="all", overrides=(("query_pre_attn_scalar", 256),))
    st = _st(rows)
    assert "attn_scale" in rows[0]["features"].split(";")
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass"  # before the scale, they agree
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "finding"
    assert st[("llamacpp", "hf", 0, "attn_probs")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]


def test_swa_pattern_must_reach_llamacpp(policy, monkeypatch):
    """Without the bool-array pattern (the converter writes none) llama.cpp falls back
    to il % 6 < 5: layer 1, full in HF, becomes sliding."""
    from harness.families import get

    monkeypatch.setattr(get("gemma3"), "write_swa_pattern", False)
    st = _st(run(policy, family="gemma3", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "pass"
    assert st[("impl", "llamacpp", 1, "q_rope")] == "fail"  # llama.cpp also rotates layer 1 with the local theta


def test_local_theta_must_reach_llamacpp(policy, monkeypatch):
    """rope_local_base_freq lives in rope.freq_base_swa; llama.cpp's default is 10000."""
    from harness.families import get

    over = (("rope_local_base_freq", 500.0),)
    st = _st(run(policy, family="gemma3", ref="llamacpp", overrides=over))
    assert all(s == "pass" for (_, _, _, p), s in st.items() if p != "*")
    monkeypatch.setattr(get("gemma3"), "write_freq_base_swa", False)
    st = _st(run(policy, family="gemma3", ref="llamacpp", overrides=over))
    assert st[("impl", "llamacpp", 0, "k")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "fail"
    assert st[("impl", "llamacpp", 1, "q_rope")] == "pass"  # the global layer reads rope.freq_base


def test_gelu_finding_is_the_fp16_table(policy):
    """The layer_out finding pinned on its cause: HF's own FFN half run with ggml's fp16
    GELU table on llama.cpp's resid_mid reproduces llama.cpp's layer_out; the exact
    GELU does not (gemma3 has a post-FFN norm, like gemma2)."""
    import torch

    from harness.case import Case, CaseRun
    from harness.families import get
    from helpers.ggml_gelu import gelu_fp16_table, max_diff

    r = CaseRun(Case(family="gemma3", ref="all", kv="decode"), policy)
    lc = r.capture("llamacpp").probes
    layer = get("gemma3").decoder_layers(r.base_model)[0]

    def ffn_half(act):
        with torch.no_grad():
            x = torch.as_tensor(lc["L0.resid_mid"], dtype=torch.float32)
            h = layer.pre_feedforward_layernorm(x)
            h = layer.mlp.down_proj(act(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
            return (x + layer.post_feedforward_layernorm(h)).numpy()

    exact = max_diff(ffn_half(layer.mlp.act_fn), lc["L0.layer_out"])
    table = max_diff(ffn_half(gelu_fp16_table), lc["L0.layer_out"])
    assert exact > 1e-4 and table < 1e-5, (exact, table)
