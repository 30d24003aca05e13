"""gpt_oss specifics: sinks and windows really active on the tiny config, the
converter's tensor split, and the HF-only YaRN configs (``truncate=false``, an
explicit ``attention_factor``): impl passes against HF, llama.cpp's
disagreement is reported as a finding."""

from __future__ import annotations

import numpy as np

from harness.testing import HF_AND_LLAMACPP, llamacpp_statuses
from harness.families import get
from harness.families.gpt_oss import ATTN_FACTOR, SWAPPED_LAYERS, TRUNCATE_OFF
from harness.mutants import registry


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "gpt_oss", ref="hf")
    assert {"sinks", "o_bias", "qkv_bias", "sliding_window", "rope_scaling", "rope_attn_factor"} <= set(r.features)
    lcs = r.layer_cfgs
    # HF layer_types: even layers slide, odd layers are full
    assert lcs[0].window is not None and lcs[0].window.size == 4 and lcs[1].window is None
    assert lcs[0].rope.attention_factor > 1.3  # 0.1 ln 32 + 1
    # the sinks take real mass: HF's returned probabilities (sink column dropped)
    # sum to well below one, and a window of 4 leaves 4 keys at most
    probs = r.capture("hf").probes["L0.attn_probs"]
    assert probs.sum(-1).min() < 0.9
    assert ((probs > 0).sum(-1) <= 4).all() and (probs[..., 8, :] > 0).sum(-1).max() == 4


def test_every_decoration_has_a_mutant(case_run, policy):
    covered = {m.decoration for m in registry().values()}
    feats = set(case_run(policy, "gpt_oss", ref="hf").features) - {"kv_decode"}
    assert feats <= covered, feats - covered


def test_gguf_mirrors_the_converter(case_run, policy):
    r = case_run(policy, "gpt_oss", ref="hf")
    fam = get("gpt_oss")
    names = dict(fam.gguf_tensors(r.base_model, r.config))
    # GptOssModel.filter_tensors appends ".weight" to the sinks
    assert "blk.0.attn_sinks.weight" in names and "blk.0.attn_output.bias" in names
    # modify_tensors: gate_up [E, H, 2I] -> gate / up [E, I, H] (interleaved columns)
    gu = r.base_model.model.layers[0].mlp.experts.gate_up_proj.detach().numpy()
    np.testing.assert_array_equal(names["blk.0.ffn_gate_exps.weight"], gu.transpose(0, 2, 1)[:, ::2, :])
    np.testing.assert_array_equal(names["blk.0.ffn_up_exps.weight"], gu.transpose(0, 2, 1)[:, 1::2, :])
    assert names["blk.0.ffn_down_exps.weight"].shape == (4, 64, 96)


def test_truncate_off_passes_against_hf_and_is_a_finding_against_llamacpp(run, policy, need_llamacpp):
    rows = run(policy, family="gpt_oss", ref=HF_AND_LLAMACPP, kv="decode", overrides=TRUNCATE_OFF)
    lc = llamacpp_statuses(rows)
    # before RoPE everything agrees; from q_rope on the YaRN ramp differs
    assert lc[(0, "q")] == lc[(0, "v")] == "pass"
    assert lc[(0, "q_rope")] == lc[(0, "attn_probs")] == lc[(1, "q_rope")] == "finding"
    refs = {(r["layer"], r["probe"]): r["status"] for r in rows if r["candidate"] == "llamacpp"}
    assert refs[(0, "k")] == "pass" and refs[(0, "q_rope")] == "finding" and refs[(-1, "logits")] == "finding"


def test_truncate_flag_reaches_impl(case_run, policy):
    on = case_run(policy, "gpt_oss", ref="hf").layer_cfgs[0].rope.inv_freq
    off = case_run(policy, "gpt_oss", ref="hf", overrides=TRUNCATE_OFF).layer_cfgs[0].rope.inv_freq
    assert not np.allclose(on, off)


def test_explicit_attention_factor_passes_against_hf_and_is_a_finding_against_llamacpp(case_run, run, policy, need_llamacpp):
    rows = run(policy, family="gpt_oss", ref=HF_AND_LLAMACPP, kv="batched", overrides=ATTN_FACTOR)
    lc = llamacpp_statuses(rows)
    assert lc[(0, "k")] == "pass" and lc[(0, "q_rope")] == lc[(1, "attn_probs")] == "finding"
    # llama.cpp's q_rope is HF's times (0.1 ln 32 + 1) / 1.1, the factor it substitutes
    r = case_run(policy, "gpt_oss", ref=HF_AND_LLAMACPP, kv="batched", overrides=ATTN_FACTOR)
    ratio = r.capture("llamacpp").probes["L0.q_rope"] / r.capture("hf").probes["L0.q_rope"]
    assert abs(np.median(ratio) - (0.1 * np.log(32) + 1) / 1.1) < 1e-4


def test_swapped_layer_pattern_is_a_finding_against_llamacpp(case_run, run, policy, need_llamacpp):
    """HF's layer_types reach impl (layer 1 slides now) but not the GGUF."""
    assert case_run(policy, "gpt_oss", ref="hf", overrides=SWAPPED_LAYERS).layer_cfgs[1].window is not None
    rows = run(policy, family="gpt_oss", ref=HF_AND_LLAMACPP, kv="paged", overrides=SWAPPED_LAYERS)
    lc = llamacpp_statuses(rows)
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"
