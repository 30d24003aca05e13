"""laguna: the softplus output gate -- one scalar per head (XS.2) and one per
channel (M.1) -- verified three-way, with the per-layer-type RoPE widths and
per-layer head counts; planted bugs in the gate fail against both references."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

PROBES = ("q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out")


def test_default_config_decorations_are_on_and_agree(run, policy):
    # decode here; batched and paged three-way: tests/test_families.py test_family_three_way
    rows = run(policy, family="laguna", ref=HF_AND_LLAMACPP, kv="decode")
    feats = set(rows[0]["features"].split(";"))
    assert {"output_gate", "softplus_gate", "output_gate_per_head", "qk_norm_head", "per_layer_heads",
            "partial_rotary", "sliding_window", "rope_neox", "gqa"} <= feats, feats
    st = all_statuses(rows)
    for ref in ("hf", "hf_cached", "llamacpp"):
        for layer in range(4):  # layer 0 full (half the head rotated, 4 heads), 1-3 sliding (8 heads)
            for probe in PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
    # the references agree with each other through the MoE layers to the logits
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"
    assert not [k for k, s in st.items() if s != "pass"]


def test_per_element_gate_agrees(run, policy):
    """gating="per-element" (M.1): g_proj is n_heads * head_dim wide; llama.cpp reads
    the width off the tensor (laguna.cpp load_arch_tensors) and multiplies directly."""
    rows = run(policy, family="laguna", ref=HF_AND_LLAMACPP, overrides=(("gating", "per-element"),))
    feats = set(rows[0]["features"].split(";"))
    assert "softplus_gate" in feats and "output_gate_per_head" not in feats
    assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"][:3]


@pytest.mark.parametrize("name", ["softplus-gate-as-sigmoid", "per-head-gate-strided"])
def test_a_broken_gate_fails_against_both_references(run, policy, name):
    """A gate broken in impl fails at the branch against HF and llama.cpp's
    `attn_gated`, and nothing before the branch does."""
    with applied(registry()[name]):
        st = all_statuses(run(policy, family="laguna", ref=HF_AND_LLAMACPP))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "attn_heads")] == "pass"
        assert st[("impl", ref, 0, "attn_branch")] == "fail", ref


def test_a_window_pattern_other_than_llamacpps_is_hf_only(run, policy, monkeypatch):
    """The converter writes no pattern key and laguna.cpp fixes it
    (load_swa_pattern(ml, 4, dense_first): full at il % 4 == 0): other layer types
    are refused for llama.cpp in one line and judged against HF alone; without the
    refusal llama.cpp rotates layer 0 as a full layer, where HF's slides."""
    from harness.families import get

    fam = get("laguna")
    over = (("layer_types", ["sliding_attention"] * 4),)
    why = fam.lc_refusal(fam.make_config(dict(over)))
    assert why and "load_swa_pattern" in why and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None
    assert all(r["status"] == "pass" for r in run(policy, family="laguna", ref="hf", overrides=over))
    monkeypatch.setattr(fam, "lc_refusal", lambda config: None)
    st = all_statuses(run(policy, family="laguna", ref="llamacpp", overrides=over))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"
