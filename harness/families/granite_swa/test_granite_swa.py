"""granite_swa specifics: the sinks and the windows really act on the tiny
config; the sink's two spellings (HF's eager output scale vs the softmax
denominator of impl and llama.cpp) -- which probe each side defines, and that
the heads agree; the converter's keys and tensors; planted bugs fail."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes_and_judges_attn_probs_where_both_sides_define_it(run, policy):
    # paged, mixed chunks here; decode and batched run in the default matrix (families = "*")
    rows = run(policy, family="granite_swa", ref=HF_AND_LLAMACPP, kv="paged", schedule="mixed")
    st = all_statuses(rows)
    bad = [k for k, s in st.items() if s not in ("pass", "not-exposed")]
    assert st and not bad, bad[:4]
    for i in range(4):
        # impl and llama.cpp both put the sink in the denominator: compared, and passing
        assert st[("impl", "llamacpp", i, "attn_probs")] == "pass"
        # HF's returned probabilities are another quantity: not compared, with the reason
        assert st[("impl", "hf", i, "attn_probs")] == "not-exposed"
        # ... and everything after the softmax is compared against every reference
        for ref in ("hf", "hf_cached", "llamacpp"):
            assert st[("impl", ref, i, "attn_heads")] == st[("impl", ref, i, "attn_out")] == "pass"
    why = next(r["reason"] for r in rows if (r["reference"], r["probe"]) == ("hf", "attn_probs"))
    assert "eager_attention_forward" in why and "denominator" in why
    # only attn_probs (impl vs hf and hf_cached, 4 layers) is not compared
    assert sum(s == "not-exposed" for s in st.values()) == 8


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "granite_swa", ref="llamacpp")
    assert {"sinks", "sliding_window", "attn_scale", "residual_multiplier"} <= set(r.features)
    lcs = r.layer_cfgs
    # HF's default layer_types (GraniteSWAConfig.__post_init__): every fourth layer full
    assert lcs[0].window is None and all(lc.window is not None and lc.window.size == 4 for lc in lcs[1:])
    # the sinks take real mass in the denominator (llama.cpp's kq_soft_max rows sum below one),
    # and the window leaves 4 keys at most on a sliding layer
    probs = r.capture("llamacpp").probes["L1.attn_probs"]
    assert probs.sum(-1).min() < 0.9
    assert ((probs > 0).sum(-1) <= 4).all() and (probs[..., 8, :] > 0).sum(-1).max() == 4


def test_hf_eager_spells_the_sink_as_an_output_scale(case_run, policy):
    """The trap, shown on HF's own tensors: its eager attention returns the softmax
    WITHOUT the sink (rows sum to one), while llama.cpp's (and impl's) rows sum to
    ``1 - sigmoid(sink - lse)``; the heads agree all the same, which is why
    attn_probs is not compared with HF and attn_heads / attn_out are."""
    import torch

    r = case_run(policy, "granite_swa", ref="llamacpp")
    with torch.no_grad():
        out = r.base_model(input_ids=torch.as_tensor(r.tokens), output_attentions=True, use_cache=False)
    hf_probs = out.attentions[1].double().numpy()  # [S, H, T, T]
    np.testing.assert_allclose(hf_probs.sum(-1), 1.0, rtol=1e-6)
    lc = r.capture("llamacpp").probes
    lc_probs = lc["L1.attn_probs"]
    assert np.abs(lc_probs.sum(-1) - 1.0).max() > 0.1  # the sink's mass: the two tensors differ
    # the sink scale turns HF's into llama.cpp's: p_lc = p_hf * (1 - e^s / (sum e^l + e^s))
    ratio = lc_probs.sum(-1) / hf_probs.sum(-1)
    assert np.all(ratio < 1.0)
    hf_heads = r.capture("hf").probes["L1.attn_heads"]
    np.testing.assert_allclose(hf_heads, lc["L1.attn_heads"], atol=1e-5)


def test_a_dropped_sink_fails_against_both_references(run, policy):
    """impl without the sink: against llama.cpp at attn_probs, against HF (which
    defines no comparable probabilities) at attn_heads -- each side where it defines the probe."""
    with applied(registry()["sink-dropped"]):
        st = all_statuses(run(policy, family="granite_swa", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("impl", "llamacpp", 1, "attn_probs")] == "fail"
    assert st[("impl", "hf", 1, "attn_heads")] == "fail" and st[("impl", "hf", 1, "attn_out")] == "fail"


def test_a_window_off_by_one_fails(run, policy):
    with applied(registry()["window-off-by-one"]):
        st = all_statuses(run(policy, family="granite_swa", ref=HF_AND_LLAMACPP, kv="batched"))
    assert st[("impl", "hf", 0, "attn_out")] == "pass"  # layer 0 is full
    assert st[("impl", "llamacpp", 1, "attn_probs")] == "fail" and st[("impl", "hf", 1, "attn_out")] == "fail"


def test_every_decoration_has_a_mutant(case_run, policy):
    covered = {m.decoration for m in registry().values()}
    feats = set(case_run(policy, "granite_swa", ref="hf").features) - {"kv_decode"}
    assert feats <= covered, feats - covered


def test_gguf_mirrors_the_converter(case_run, policy, tmp_path):
    import gguf

    r = case_run(policy, "granite_swa", ref="hf")
    fam = get("granite_swa")
    names = dict(fam.gguf_tensors(r.base_model, r.config))
    # GraniteSWAModel.filter_tensors appends ".weight" to the sinks
    sinks = r.base_model.model.layers[2].self_attn.sinks.detach().numpy()
    np.testing.assert_array_equal(names["blk.2.attn_sinks.weight"], sinks)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "granite_swa")
    fam.gguf_params(w, r.config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert kv["granite_swa.attention.sliding_window"] == 4
    assert list(kv["granite_swa.attention.sliding_window_pattern"]) == [False, True, True, True]
    assert kv["granite_swa.attention.scale"] == np.float32(0.15)
    assert "granite_swa.attention.rope_pattern" not in kv  # HF's config has no no_rope_layers


def test_per_layer_theta_reaches_impl(case_run, run, policy):
    """layer_rope_theta (GraniteSWAModel: one rotary per theta, 0 = NoPE) is impl's."""
    r = case_run(policy, "granite_swa", ref="hf", overrides=(("layer_rope_theta", [0, 10000.0, 500.0, 10000.0]),))
    lcs = r.layer_cfgs
    assert lcs[0].rope is None and lcs[1].rope is not None
    assert not np.allclose(lcs[2].rope.inv_freq, lcs[1].rope.inv_freq)
    st = all_statuses(run(policy, family="granite_swa", ref="hf", kv="decode",
                          overrides=(("layer_rope_theta", [0, 10000.0, 500.0, 10000.0]),)))
    assert st and all(s in ("pass", "not-exposed") for s in st.values())
