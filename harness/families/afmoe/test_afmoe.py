"""afmoe: the output gate from a separate projection of the normed input,
verified against both references, and the settings llama.cpp's afmoe graph
cannot express (its fixed layer pattern, its unconditional muP scaling, no
o_proj bias)."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_rotation_step_finding
from harness.mutants import applied, registry

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_default_config_decorations_are_on_and_agree(run, policy):
    rows = run(policy, family="afmoe", ref=HF_AND_LLAMACPP)
    feats = set(rows[0]["features"].split(";"))
    assert {"output_gate", "qk_norm_head", "post_norm", "sliding_window", "nope_layers", "rope_neox", "gqa"} <= feats
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        for layer in range(4):  # layers 0-2 sliding with RoPE, layer 3 full and NoPE
            for probe in ("q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
    # the references agree with each other through the MoE layers to the logits
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"
    assert not [k for k, s in st.items() if s != "pass"]


@pytest.mark.parametrize("name", ["output-gate-from-raw-input", "output-gate-after-wo", "output-gate-tanh-for-sigmoid"])
def test_a_broken_gate_fails_against_llamacpp_too(run, policy, name):
    """llama.cpp's `attn_gated` is the branch: a gate broken in impl fails there
    as it does against HF, and nothing before the branch does."""
    with applied(registry()[name]):
        st = all_statuses(run(policy, family="afmoe", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_heads")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_branch")] == "fail"


def test_hf_only_global_attention_every_2(run, policy):
    """global_attn_every_n_layers=2: HF's layer 1 is full and NoPE; llama.cpp's
    pattern is fixed at 4, so it rotates and windows layer 1."""
    assert_llamacpp_rotation_step_finding(run(policy, family="afmoe", ref=HF_AND_LLAMACPP,
                                              overrides=(("global_attn_every_n_layers", 2),)))


def test_hf_only_mup_disabled(run, policy):
    """mup_enabled=false: llama.cpp scales the embeddings anyway; impl, fed each
    reference's own layer input, agrees with both."""
    rows = run(policy, family="afmoe", ref=HF_AND_LLAMACPP, overrides=(("mup_enabled", False),))
    st = all_statuses(rows)
    assert all(s == "pass" for (c, _, _, _), s in st.items() if c == "impl")
    assert st[("llamacpp", "hf", -1, "embeddings")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_in")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]


def test_the_findings_need_their_settings(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "afmoe", "llamacpp", "hf", "layer_in", {"mup_enabled": False}, layer=0)
    assert not finding(pol, "afmoe", "llamacpp", "hf", "layer_in", {}, layer=0)
    assert finding(pol, "afmoe", "impl", "llamacpp", "q_rope", {"global_attn_every_n_layers": 2}, layer=1)
    assert not finding(pol, "afmoe", "impl", "llamacpp", "q_rope", {}, layer=1)
    # before layer 1's rotation the setting excuses nothing
    assert not finding(pol, "afmoe", "impl", "llamacpp", "q_rope", {"global_attn_every_n_layers": 2}, layer=0)


def test_attention_bias_is_hf_only(run, policy):
    """HF's attention_bias adds an o_proj bias afmoe.cpp has no tensor for: HF
    alone judges it, and llama.cpp refuses the converted file."""
    rows = run(policy, family="afmoe", ref="hf", kv="paged", overrides=(("attention_bias", True),))
    assert {"o_bias", "qkv_bias", "output_gate"} <= set(rows[0]["features"].split(";"))
    assert all(r["status"] == "pass" for r in rows)
    rows = run(policy, family="afmoe", ref="llamacpp", kv="paged", overrides=(("attention_bias", True),))
    assert [r["status"] for r in rows] == ["error"]
    assert "wrong number of tensors" in rows[0]["reason"]
