"""gemma2 specifics: softcap, post-norm and window active on the tiny config; the
converter's ``w + 1`` norms; the HF-only configs (query_pre_attn_scalar != head_dim
-> finding against llama.cpp; an o_proj bias before the post-norm, HF only); and
the ref-vs-ref FFN finding pinned on its cause (ggml's fp16 GELU table)."""

from __future__ import annotations

from impl.config import softmax_scale
import numpy as np

from harness.testing import HF_AND_LLAMACPP, llamacpp_statuses, statuses
from harness.families import get
from harness.families.gemma2 import O_BIAS, QPAS_24, SWAPPED_LAYERS, THETA_1E5
from harness.mutants import registry
from harness.testing.ggml_gelu import assert_fp16_gelu_explains_layer_out, gemma_ffn_half


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "gemma2", ref="hf")
    assert {"softcap", "post_norm", "sliding_window"} <= set(r.features)
    lc0, lc1 = r.layer_cfgs
    assert lc0.window is not None and lc1.window is None
    assert lc0.input_norm.kind == lc0.post_norm.kind == "rms1p"
    # the cap binds: the largest scaled logits are far enough out that tanh bends
    # them by a visible amount (not the near-linear regime of HF's default cap 50)
    hf = r.capture("hf").probes
    q, k = hf["L1.q_rope"], hf["L1.k_rope"]  # [S, T, H, D]
    k = np.repeat(k, lc1.n_rep, axis=2)
    scores = np.einsum("sthd,suhd->shtu", q, k) * softmax_scale(lc1)
    bend = np.abs(lc1.softcap * np.tanh(scores / lc1.softcap) - scores).max()
    assert bend > 0.3, bend


def test_every_decoration_has_a_mutant(case_run, policy):
    covered = {m.decoration for m in registry().values()}
    for overrides in ((), QPAS_24, O_BIAS):
        feats = set(case_run(policy, "gemma2", ref="hf", overrides=overrides).features) - {"kv_decode"}
        assert feats <= covered, feats - covered


def test_gguf_mirrors_the_converter(case_run, policy):
    r = case_run(policy, "gemma2", ref="hf")
    names = dict(get("gemma2").gguf_tensors(r.base_model, r.config))
    assert "output.weight" not in names  # Gemma2Model.filter_tensors drops lm_head
    w = r.base_model.model.layers[0].post_attention_layernorm.weight.detach().numpy()
    np.testing.assert_allclose(names["blk.0.post_attention_norm.weight"], w + 1)


def test_query_pre_attn_scalar_passes_against_hf_and_is_a_finding_against_llamacpp(run, policy, need_llamacpp):
    rows = run(policy, family="gemma2", ref=HF_AND_LLAMACPP, kv="decode", overrides=QPAS_24)
    assert "attn_scale" in rows[0]["features"].split(";")
    lc = llamacpp_statuses(rows)
    # q_rope is unscaled on both sides and agrees; the softmax does not
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"


def test_o_bias_before_post_norm_against_hf(run, policy):
    rows = run(policy, family="gemma2", ref="hf", kv="paged", overrides=O_BIAS)
    assert {"o_bias", "qkv_bias", "post_norm"} <= set(rows[0]["features"].split(";"))
    st = statuses(rows)
    assert st and all(v == "pass" for v in st.values())


def test_ffn_finding_is_the_fp16_gelu_table(case_run, policy, need_llamacpp):
    """llama.cpp's layer_out differs from HF's by ~1e-3 (the [[finding]]); HF's own
    FFN half run with ggml's fp16 GELU table on llama.cpp's resid_mid reproduces
    llama.cpp's layer_out to float32 rounding, while the exact GELU does not."""
    r = case_run(policy, "gemma2", ref=HF_AND_LLAMACPP, kv="decode")
    layer = get("gemma2").decoder_layers(r.base_model)[0]
    assert_fp16_gelu_explains_layer_out(r.capture("llamacpp").probes, gemma_ffn_half(layer), layer.mlp.act_fn)


def test_rope_theta_is_a_finding_against_llamacpp(run, policy, need_llamacpp):
    """The converter writes no rope.freq_base: llama.cpp rotates with 10000."""
    rows = run(policy, family="gemma2", ref=HF_AND_LLAMACPP, kv="paged", overrides=THETA_1E5)
    lc = llamacpp_statuses(rows)
    assert lc[(0, "q")] == "pass" and lc[(0, "q_rope")] == lc[(1, "attn_probs")] == "finding"
    # the L1 rows of llama.cpp vs HF are this finding's, not the (bounded) GELU one's
    l1 = [r for r in rows if r["candidate"] == "llamacpp" and r["layer"] == 1 and r["probe"] == "attn_probs"]
    assert l1 and "freq_base" in l1[0]["reason"]


def test_swapped_layer_pattern_is_a_finding_against_llamacpp(run, policy, need_llamacpp):
    """The converter writes no layer pattern; llama.cpp slides the even layers."""
    rows = run(policy, family="gemma2", ref=HF_AND_LLAMACPP, kv="decode", overrides=SWAPPED_LAYERS)
    lc = llamacpp_statuses(rows)
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"
