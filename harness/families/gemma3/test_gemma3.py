"""gemma3: what only gemma3 brings -- local/global theta and window written
where llama.cpp reads them, and the HF-only query_pre_attn_scalar."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_default_config_decorations_are_on(run, policy):
    rows = run(policy, family="gemma3", ref="hf")
    feats = set(rows[0]["features"].split(";"))
    assert {"rms1p", "qk_norm_head", "post_norm", "per_layer_theta", "sliding_window", "rope_neox"} <= feats
    assert "attn_scale" not in feats  # query_pre_attn_scalar == head_dim: both references agree


def test_gelu_table_is_a_finding_not_a_failure(run, policy):
    """llama.cpp's fp16 GELU table makes layer_out differ from HF (the MLP half);
    impl, teacher-forced, still passes against both on every probe."""
    rows = run(policy, family="gemma3", ref=HF_AND_LLAMACPP)
    st = all_statuses(rows)
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass"  # layer 0's attention agrees
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"
    assert all(s == "pass" for (c, ref, _, p), s in st.items() if c == "impl" and p != "*")


def test_hf_only_query_pre_attn_scalar(run, policy):
    """HF scales by query_pre_attn_scalar ** -0.5; llama.cpp by 1/sqrt(head_dim)."""
    rows = run(policy, family="gemma3", ref=HF_AND_LLAMACPP, overrides=(("query_pre_attn_scalar", 256),))
    st = all_statuses(rows)
    assert "attn_scale" in rows[0]["features"].split(";")
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass"  # before the scale, they agree
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "finding"
    assert st[("llamacpp", "hf", 0, "attn_probs")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]


def test_swa_pattern_must_reach_llamacpp(run, policy, monkeypatch):
    """Without the bool-array pattern (the converter writes none) llama.cpp falls back
    to il % 6 < 5: layer 1, full in HF, becomes sliding."""
    from harness.families import get

    monkeypatch.setattr(get("gemma3"), "_write_swa_pattern", False)
    st = all_statuses(run(policy, family="gemma3", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "pass"
    assert st[("impl", "llamacpp", 1, "q_rope")] == "fail"  # llama.cpp also rotates layer 1 with the local theta


def test_local_theta_must_reach_llamacpp(run, policy, monkeypatch):
    """rope_local_base_freq lives in rope.freq_base_swa; llama.cpp's default is 10000."""
    from harness.families import get

    over = (("rope_local_base_freq", 500.0),)
    st = all_statuses(run(policy, family="gemma3", ref="llamacpp", overrides=over))
    assert all(s == "pass" for (_, _, _, p), s in st.items() if p != "*")
    monkeypatch.setattr(get("gemma3"), "_write_freq_base_swa", False)
    st = all_statuses(run(policy, family="gemma3", ref="llamacpp", overrides=over))
    assert st[("impl", "llamacpp", 0, "k")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "fail"
    assert st[("impl", "llamacpp", 1, "q_rope")] == "pass"  # the global layer reads rope.freq_base


def test_gelu_finding_is_the_fp16_table(case_run, policy):
    """The layer_out finding pinned on its cause: HF's own FFN half run with ggml's fp16
    GELU table on llama.cpp's resid_mid reproduces llama.cpp's layer_out; the exact
    GELU does not (gemma3 has a post-FFN norm, like gemma2)."""
    from harness.families import get
    from harness.testing.ggml_gelu import assert_fp16_gelu_explains_layer_out, gemma_ffn_half

    r = case_run(policy, "gemma3", ref=HF_AND_LLAMACPP, kv="decode")
    layer = get("gemma3").decoder_layers(r.base_model)[0]
    assert_fp16_gelu_explains_layer_out(r.capture("llamacpp").probes, gemma_ffn_half(layer), layer.mlp.act_fn)
