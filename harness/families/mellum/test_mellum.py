"""mellum: three-way on qwen3_moe's attention with a sliding layer and RoPE per
layer type; the sliding theta llama.cpp's graph never uses (a finding, bounded,
on the sliding layer only); dense MLP layers refused for llama.cpp; a broken
window in impl fails against both references."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

FULL_5E5 = (("rope_parameters.full_attention", {"rope_type": "default", "rope_theta": 500000.0}),)


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    rows = run(policy, family="mellum", ref=HF_AND_LLAMACPP, kv="paged")
    st = all_statuses(rows)
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert {"sliding_window", "qk_norm_head", "gqa"} <= set(rows[0]["features"].split(";"))


def test_the_sliding_theta_is_a_finding_on_the_sliding_layer(run, policy):
    st = all_statuses(run(policy, family="mellum", ref=HF_AND_LLAMACPP, kv="decode", overrides=FULL_5E5))
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    # layer 0 slides (theta 1e4 in HF, 5e5 in llama.cpp), layer 1 is full (5e5 on both sides)
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "finding"
    assert st[("impl", "llamacpp", 1, "q_rope")] == "pass"
    assert st[("llamacpp", "hf", 0, "k_rope")] == "finding"


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "mellum", "llamacpp", "hf", "q_rope", dict(FULL_5E5), nmse=0.2)
    assert not finding(pol, "mellum", "llamacpp", "hf", "q_rope", {}, nmse=0.2)
    assert not finding(pol, "mellum", "llamacpp", "hf", "q_rope", dict(FULL_5E5), nmse=100.0)


def test_dense_layers_are_refused_for_llamacpp_in_one_line():
    from harness.families import get

    fam = get("mellum")
    cfg = fam.make_config({"mlp_layer_types": ["dense", "sparse"]})
    why = fam.lc_refusal(cfg)
    assert why and "ffn_gate_inp" in why and "[0]" in why and "\n" not in why
    assert fam.hf_refusal(cfg) is None
    assert fam.lc_refusal(fam.make_config({})) is None


def test_a_broken_window_fails_against_both_references(run, policy):
    with applied(registry()["window-off-by-one"]):
        st = all_statuses(run(policy, family="mellum", ref=HF_AND_LLAMACPP, kv="decode"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q_rope")] == "pass" and st[("impl", ref, 0, "attn_probs")] == "fail", ref


def test_unnormalised_routing_is_a_bounded_finding(finding, run, policy):
    from harness.policy import load_policy

    unnormed = {"norm_topk_prob": False}
    st = all_statuses(run(policy, family="mellum", ref=HF_AND_LLAMACPP, kv="decode", overrides=tuple(unnormed.items())))
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    assert all(s == "pass" for (c, _r, *_), s in st.items() if c == "impl")
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass" and st[("llamacpp", "hf", 1, "layer_out")] == "finding"
    pol = load_policy()
    assert finding(pol, "mellum", "llamacpp", "hf", "layer_out", unnormed, nmse=0.0176, layer=1)
    assert not finding(pol, "mellum", "llamacpp", "hf", "layer_out", {}, nmse=0.0176, layer=1)
    assert not finding(pol, "mellum", "llamacpp", "hf", "layer_out", unnormed, nmse=0.5, layer=1)
    assert not finding(pol, "mellum", "llamacpp", "hf", "attn_out", unnormed, nmse=0.0176, layer=0)  # upstream
