"""llama's wo_scale variant: the `wo` scale companion (spec project_attn_rows),
verified against llama.cpp, which applies `blk.N.attn_output.scale` after `wo`'s
product and before `wo_b` (llama-graph.cpp build_attn), and against HF, which
holds the unscaled weight."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses
from harness.families import get
from harness.families.llama import WO_SCALE
from harness.mutants import applied, registry

pytestmark = pytest.mark.usefixtures("need_llamacpp")

BIAS = (("attention_bias", True),)


def test_plain_is_the_default_variant(run, policy):
    rows = run(policy, family="llama", ref="hf")
    assert {r["variant"] for r in rows} == {"plain"}
    assert "o_scale" not in rows[0]["features"].split(";")
    assert "variant=" not in rows[0]["case_id"]  # a case that names no variant keeps its id
    assert get("llama").variants[0] == "plain"
    # olmo and smollm3 extend Llama; the variant is llama's alone
    assert get("olmo").variants == () and get("smollm3").variants == ()


@pytest.mark.parametrize("kv", ["decode", "paged"])
@pytest.mark.parametrize("overrides", [(), BIAS], ids=["no-bias", "bias"])
def test_wo_scale_three_way(run, policy, kv, overrides):
    rows = run(policy, family="llama", variant="wo_scale", ref=HF_AND_LLAMACPP, kv=kv, overrides=overrides)
    feats = set(rows[0]["features"].split(";"))
    assert "o_scale" in feats and ("o_bias" in feats) == bool(overrides)
    assert {r["variant"] for r in rows} == {"wo_scale"}
    assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"][:3]
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 1, "attn_out")] == "pass"


def test_the_file_holds_w_over_s_and_its_companion(case_run, gguf_export):
    import gguf

    from harness.policy import load_policy

    cr = case_run(load_policy(), "llama", variant="wo_scale")
    path = gguf_export.export(cr.family, cr.base_model, cr.config, "f32", 0, "wo_scale")
    t = {x.name: x for x in gguf.GGUFReader(str(path)).tensors}
    s = np.asarray(t["blk.0.attn_output.scale"].data)
    assert s.shape == (1,) and s[0] == np.float32(WO_SCALE)
    w = cr.base_model.model.layers[0].self_attn.o_proj.weight.detach().numpy()
    np.testing.assert_allclose(np.asarray(t["blk.0.attn_output.weight"].data), w / np.float32(WO_SCALE), rtol=1e-6)
    # impl: wo / s with o_scale = s
    assert cr.layer_cfgs[0].o_scale == WO_SCALE
    np.testing.assert_allclose(cr.weights_for("float32")[0]["wo"] * WO_SCALE, w, rtol=1e-12)


def test_without_the_companion_llamacpp_computes_with_w_over_s(run, policy, monkeypatch):
    """The scale must reach llama.cpp: a file with W / s and no attn_output.scale
    differs from the first probe after wo, and only there."""
    monkeypatch.setattr(get("llama"), "_write_wo_scale", False)
    st = all_statuses(run(policy, family="llama", variant="wo_scale", ref=HF_AND_LLAMACPP))
    assert st[("impl", "llamacpp", 0, "attn_branch")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_out")] == "fail"
    assert st[("llamacpp", "hf", 0, "attn_out")] == "fail"
    assert st[("impl", "hf", 0, "attn_out")] == "pass"


@pytest.mark.parametrize("name,overrides", [("o-scale-dropped", ()), ("o-scale-after-bias", BIAS)])
def test_a_broken_scale_fails_against_llamacpp_too(run, policy, name, overrides):
    with applied(registry()[name]):
        st = all_statuses(run(policy, family="llama", variant="wo_scale", ref="llamacpp", overrides=overrides))
    assert st[("impl", "llamacpp", 0, "attn_branch")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_out")] == "fail"


def test_gguf_import_folds_the_companion(case_run, gguf_export, gguf_import, run, policy, tmp_path):
    """--gguf on a file with attn_output.scale: HF gets W = W' * s, impl computes
    from it, and both agree with llama.cpp running the file."""
    from harness.policy import load_policy

    cr = case_run(load_policy(), "llama", variant="wo_scale", overrides=BIAS)
    path = gguf_export.export(cr.family, cr.base_model, cr.config, "f32", 0, "wo_scale")
    src = gguf_import.load(str(path))
    w = cr.base_model.model.layers[1].self_attn.o_proj.weight.detach().numpy()
    got = src.model.model.layers[1].self_attn.o_proj.weight.detach().numpy()
    np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)
    rows = run(policy, family="", gguf=str(path), ref="llamacpp", kv="paged")
    assert rows and all(r["status"] == "pass" for r in rows)


def test_partial_rotary_factor_is_not_a_key_llama_reads(run, policy):
    """transformers' LlamaRotaryEmbedding.compute_default_rope_parameters sizes the rotation
    head_dim whatever rope_parameters.partial_rotary_factor says (modeling_llama.py), and so
    does llama.cpp (the converter writes rope.dimension_count = head_dim): impl rotates the
    whole head too -- it rotated half, and failed against both, before the family read the
    HF source (base.hf_default_rope_reads). phi's does read it."""
    from harness import families
    from harness.families.base import hf_default_rope_reads
    from harness.testing import statuses

    assert not hf_default_rope_reads(families.get("llama").config_class(), "partial_rotary_factor")
    assert hf_default_rope_reads(families.get("phi").config_class(), "partial_rotary_factor")
    rows = run(policy, family="llama", ref="hf", overrides=(("rope_parameters.partial_rotary_factor", 0.5),))
    st = statuses(rows)
    assert st[("hf", 0, "q_rope")] == "pass" and set(st.values()) <= {"pass", "not-exposed"}, st
