"""minicpm3 specifics: MLA with rotate-half LongRoPE slices and the muP scales,
three-way at llama.cpp's hard-coded constants and a bounded finding one step
away from each; the converter's keys; planted bugs fail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.families import get
from harness.families.minicpm3 import LC_DIM_MODEL_BASE, LC_SCALE_DEPTH, LC_SCALE_EMB
from harness.mutants import applied, registry
from harness.policy import dataflow_position
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes_at_llamacpps_constants(run, policy):
    # paged, mixed chunks here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="minicpm3", ref=HF_AND_LLAMACPP, kv="paged", schedule="mixed"))
    bad = [k for k, s in st.items() if s not in ("pass", "not-exposed")]
    assert st and not bad, bad[:4]
    # llama.cpp vs HF agree end to end: the muP scales ARE llama.cpp's constants here
    for probe in ("embeddings", "logits"):
        assert st[("llamacpp", "hf", -1, probe)] == "pass"
    assert all(st[("impl", ref, i, p)] == "pass" for ref in ("hf", "llamacpp") for i in range(2)
               for p in ("q_rope", "k_rope", "attn_probs", "attn_out", "resid_mid"))


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "minicpm3", ref="hf")
    assert {"mla_naive", "mla_low_rank_q", "mla_rope", "mla_longrope", "mla_residual_multiplier"} \
        <= set(r.features)
    c = r.config
    assert (c.scale_emb, c.scale_depth, c.dim_model_base) == (LC_SCALE_EMB, LC_SCALE_DEPTH, LC_DIM_MODEL_BASE)
    lc = r.layer_cfgs[0]
    assert lc.rope.layout == "neox" and lc.rope.freq_factors == (1.0, 1.25, 1.875, 2.5)  # the short set
    assert lc.rope.attention_factor == 1.0  # max == original positions
    assert math.isclose(lc.residual_multiplier, 1.4 / math.sqrt(2))
    hf = r.capture("hf").probes
    # the embeddings probe is the scaled one (MiniCPM3ScaledWordEmbedding), the first layer's input
    raw = r.base_model.model.embed_tokens.weight.detach().numpy()[r.tokens]
    np.testing.assert_allclose(hf["embeddings"], raw * 12.0, rtol=1e-6)
    np.testing.assert_allclose(hf["L0.resid_mid"], hf["L0.layer_in"] + lc.residual_multiplier * hf["L0.attn_out"],
                               atol=1e-5)


@pytest.mark.parametrize("key,value,first", [("scale_emb", 10.0, "embeddings"), ("scale_depth", 1.0, "L0.attn_out"),
                                             ("dim_model_base", 64, "logits")])
def test_a_scale_away_from_llamacpps_constant_is_a_bounded_finding(run, policy, key, value, first):
    """The trap: llama.cpp hard-codes the muP scales (minicpm3.cpp:65-67). Away from
    them, impl passes against HF and llama.cpp's disagreement is a finding -- from
    the first probe the scale reaches on, nowhere before it."""
    rows = run(policy, family="minicpm3", ref=HF_AND_LLAMACPP, kv="decode", overrides=((key, value),))
    assert not [r for r in rows if r["status"] in ("fail", "error", "unguarded")]
    st = all_statuses(rows)
    assert all(s in ("pass", "not-exposed") for (c, ref, _, _), s in st.items() if (c, ref) == ("impl", "hf"))
    lc_hf = {(r["layer"], r["probe"]): r["status"] for r in rows if (r["candidate"], r["reference"]) == ("llamacpp", "hf")}
    layer, _, probe = first.rpartition(".")
    at = (int(layer[1:]) if layer else -1, probe)
    assert lc_hf[at] == "finding" and "minicpm3.cpp" in next(
        r["reason"] for r in rows if (r["candidate"], r["reference"], r["layer"], r["probe"]) == ("llamacpp", "hf", *at))
    # nothing upstream of the first probe the scale reaches is excused
    first_pos = dataflow_position(None if at[0] < 0 else at[0], probe)
    before = [k for k, s in lc_hf.items() if s == "finding"
              and dataflow_position(None if k[0] < 0 else k[0], k[1]) < first_pos]
    assert not before, before
    if key == "dim_model_base":
        assert [k for k, s in lc_hf.items() if s == "finding"] == [(-1, "logits")]


def test_a_finding_is_bounded_by_its_measured_size(run, policy):
    """A scale further away than the one measured is not excused: scale_emb = 1 is a fail."""
    rows = run(policy, family="minicpm3", ref=HF_AND_LLAMACPP, kv="decode", overrides=(("scale_emb", 1.0),))
    st = all_statuses(rows)
    assert st[("llamacpp", "hf", -1, "embeddings")] == "fail"


def test_a_dropped_residual_multiplier_fails(run, policy):
    with applied(registry()["mla-residual-multiplier-dropped"]):
        st = all_statuses(run(policy, family="minicpm3", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("impl", "hf", 0, "attn_out")] == st[("impl", "llamacpp", 0, "attn_heads")] == "pass"
    assert st[("impl", "hf", 0, "resid_mid")] == st[("impl", "llamacpp", 0, "resid_mid")] == "fail"


@pytest.mark.parametrize("mutant", ["mla-rope-neox-as-pairs", "mla-longrope-factors-dropped"])
def test_a_wrong_rotation_fails_against_both(run, policy, mutant):
    with applied(registry()[mutant]):
        st = all_statuses(run(policy, family="minicpm3", ref=HF_AND_LLAMACPP, kv="batched"))
    assert st[("impl", "hf", 0, "q")] == "pass"
    assert st[("impl", "hf", 0, "q_rope")] == st[("impl", "llamacpp", 0, "q_rope")] == "fail"
    assert st[("impl", "llamacpp", 0, "k_pe")] == "fail"


def test_every_decoration_has_a_mutant(case_run, policy):
    covered = {m.decoration for m in registry().values()}
    feats = set(case_run(policy, "minicpm3", ref="hf").features) - {"kv_decode"}
    assert feats <= covered, feats - covered


def test_gguf_mirrors_the_converter(case_run, policy, tmp_path):
    import gguf

    r = case_run(policy, "minicpm3", ref="hf")
    fam = get("minicpm3")
    names = dict(fam.gguf_tensors(r.base_model, r.config))
    # MiniCPM3Model.generate_extra_tensors: the factor sets as global tensors; kv_b unsplit (naive)
    np.testing.assert_array_equal(names["rope_factors_short.weight"], np.float32([1.0, 1.25, 1.875, 2.5]))
    assert "blk.0.attn_kv_b.weight" in names and "blk.0.attn_k_b.weight" not in names
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "minicpm3")
    fam.gguf_params(w, r.config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert kv["minicpm3.attention.key_length"] == 20 and kv["minicpm3.rope.dimension_count"] == 8
    assert kv["minicpm3.attention.q_lora_rank"] == 24 and kv["minicpm3.attention.kv_lora_rank"] == 24
    # none of the muP scales, no rope base, no value length (MiniCPM3Model.set_gguf_parameters)
    assert not [k for k in kv if "scale" in k or "freq_base" in k or "value_length" in k]
