"""dbrx: three-way on the clamped fused Wqkv with GQA and experts; the clamp
active and tapped from HF's own rotation call; the attn_config.rope_theta HF
ignores (a finding, bounded); the clamp-less config refused (HF's forward and the
converter both need a clamp); a
broken clamp in impl fails against both references."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

THETA = (("attn_config.rope_theta", 500000.0),)


def test_three_way_passes_and_the_clamp_is_active(case_run, run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    rows = run(policy, family="dbrx", ref=HF_AND_LLAMACPP, kv="paged")
    st = all_statuses(rows)
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert {"qkv_clamp", "gqa", "layernorm", "rope_neox"} <= set(rows[0]["features"].split(";"))
    for ref in ("hf", "llamacpp"):
        for probe in ("q", "k", "v", "q_rope", "attn_probs"):
            assert st[("impl", ref, 0, probe)] == "pass", (ref, probe)
    # HF's own Q / K / V (as apply_rotary_pos_emb and the eager attention receive them) sit at +-clip_qkv
    hf = case_run(policy, "dbrx").capture("hf").probes
    qkv = np.concatenate([hf[f"L0.{p}"].ravel() for p in ("q", "k", "v")])
    assert np.abs(qkv).max() == pytest.approx(1.5) and 0.05 < np.mean(np.isclose(np.abs(qkv), 1.5)) < 0.5


def test_attn_config_rope_theta_is_a_finding_between_the_references(run, policy):
    st = all_statuses(run(policy, family="dbrx", ref=HF_AND_LLAMACPP, kv="decode", overrides=THETA))
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    # impl computes HF's model: every row against HF passes
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "finding"
    assert st[("llamacpp", "hf", 0, "q_rope")] == st[("llamacpp", "hf", 1, "layer_out")] == "finding"


def test_the_finding_needs_its_setting_and_is_bounded(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "dbrx", "llamacpp", "hf", "q_rope", dict(THETA), nmse=0.16)
    assert not finding(pol, "dbrx", "llamacpp", "hf", "q_rope", {}, nmse=0.16)
    # bounded by the arithmetic (4 for a rotation, 2 per token downstream: 32 at 16 tokens)
    assert not finding(pol, "dbrx", "llamacpp", "hf", "q_rope", dict(THETA), nmse=100.0)


def test_no_clamp_is_refused_in_one_line():
    import torch

    from harness.families import get

    fam = get("dbrx")
    no_clamp = fam.make_config({"attn_config.clip_qkv": None})
    why = fam.lc_refusal(no_clamp)
    assert why and "clamp_kqv" in why and "\n" not in why
    why = fam.hf_refusal(no_clamp)
    assert why and "clamp(min=None" in why and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None and fam.hf_refusal(fam.make_config({})) is None
    # each reference asks the family for its own side's
    from harness import references

    assert references.get("llamacpp").config_refusal(fam, no_clamp) == fam.lc_refusal(no_clamp)
    for ref in ("hf", "hf_cached"):
        assert references.get(ref).config_refusal(fam, no_clamp) == fam.hf_refusal(no_clamp)
    # what the HF refusal is about: HF's own forward fails without a clamp
    model = fam.build_model(no_clamp, 0)
    with pytest.raises(RuntimeError, match="clamp"):
        model(torch.zeros(1, 4, dtype=torch.long))


def test_the_file_carries_the_converter_s_layout(gguf_export):
    """conversion/dbrx.py: eps 1e-5, clamp_kqv, the experts viewed (E, F, H), w2 transposed."""
    import gguf

    from harness import families

    fam = families.get("dbrx")
    config = fam.make_config({})
    model = fam.build_model(config, 5)
    r = gguf.GGUFReader(str(gguf_export.export(fam, model, config, "f32", 5, None)))

    def f32(key):
        field = r.get_field(f"dbrx.{key}")
        return float(np.float32(field.parts[field.data[0]][0]))

    assert f32("attention.layer_norm_epsilon") == pytest.approx(1e-5) and f32("attention.clamp_kqv") == 1.5
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    w2 = model.transformer.blocks[0].ffn.experts.mlp.w2.detach().numpy().reshape(4, 32, 64)
    np.testing.assert_array_equal(t["blk.0.ffn_down_exps.weight"], w2.transpose(0, 2, 1))
    w1 = model.transformer.blocks[0].ffn.experts.mlp.w1.detach().numpy().reshape(4, 32, 64)
    np.testing.assert_array_equal(t["blk.0.ffn_gate_exps.weight"], w1)


def test_a_broken_clamp_fails_against_both_references(run, policy):
    with applied(registry()["qkv-clamp-upper-bound"]):
        st = all_statuses(run(policy, family="dbrx", ref=HF_AND_LLAMACPP, kv="decode"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "attn_in")] == "pass" and st[("impl", ref, 0, "q")] == "fail", ref


def test_a_p_norm_routing_is_a_bounded_finding(finding, run, policy):
    from harness.policy import load_policy

    p2 = (("ffn_config.moe_normalize_expert_weights", 2.0),)
    st = all_statuses(run(policy, family="dbrx", ref=HF_AND_LLAMACPP, kv="decode", overrides=p2))
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    assert all(s == "pass" for (c, _r, *_), s in st.items() if c == "impl")
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass" and st[("llamacpp", "hf", 0, "layer_out")] == "finding"
    pol = load_policy()
    assert not finding(pol, "dbrx", "llamacpp", "hf", "layer_out", {}, nmse=0.018, layer=1)
    assert not finding(pol, "dbrx", "llamacpp", "hf", "layer_out", dict(p2), nmse=0.5, layer=1)
