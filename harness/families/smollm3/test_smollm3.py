"""smollm3: NoPE every fourth layer (llama.cpp: fixed at 4), the llama Q/K
permutation, and the HF-only settings llama.cpp cannot express."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_fails_first_at_q, assert_llamacpp_rotation_step_finding

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_nope_layer_is_compared_on_both_sides(run, policy):
    rows = run(policy, family="smollm3", ref=HF_AND_LLAMACPP)
    assert "nope_layers" in rows[0]["features"].split(";")
    st = all_statuses(rows)
    # layer 3 is NoPE: llama.cpp has no ROPE node there, its q_rope is the reshaped Qcur
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 3, "q_rope")] == "pass"
        assert st[("impl", ref, 3, "attn_probs")] == "pass"


def test_broken_qk_permutation_fails_at_q(run, policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("smollm3"), "_permute_qk", False)
    st = all_statuses(run(policy, family="smollm3", ref=HF_AND_LLAMACPP))
    assert_llamacpp_fails_first_at_q(st)
    assert st[("impl", "llamacpp", 0, "v")] == "pass"


def test_hf_only_nope_interval(run, policy):
    """no_rope_layer_interval=2: HF leaves layer 1 unrotated, llama.cpp (step 4) rotates it."""
    assert_llamacpp_rotation_step_finding(run(policy, family="smollm3", ref=HF_AND_LLAMACPP,
                                              overrides=(("no_rope_layer_interval", 2),)))


def test_the_nope_finding_needs_a_pattern_other_than_llamacpps(finding, policy):
    """The finding is keyed on HF's NoPE pattern, however it was said (the interval, or the
    list no_rope_layers real checkpoints carry -- before issue 39 only the interval
    reached it): llama.cpp's own every-4th pattern, said either way, is excused nothing."""
    from harness.policy import load_policy

    pol = load_policy()
    for differs in ({"no_rope_layer_interval": 2}, {"no_rope_layers": [1, 0, 1, 1]}, {"no_rope_layers": [0, 1, 1, 1]}):
        assert finding(pol, "smollm3", "impl", "llamacpp", "q_rope", differs, layer=1), differs
    for same in ({}, {"no_rope_layer_interval": 4}, {"no_rope_layers": [1, 1, 1, 0]}):
        assert not finding(pol, "smollm3", "impl", "llamacpp", "q_rope", same, layer=1), same


def test_a_nope_list_runs_three_way_with_its_finding(run, policy):
    """no_rope_layers=[1, 0, 1, 1]: layer 1 unrotated in HF and rotated in llama.cpp, layer 3
    the other way round; impl passes HF everywhere, and both layers' q_rope against
    llama.cpp are the finding (before issue 39: fails, the finding keyed on the interval)."""
    st = all_statuses(run(policy, family="smollm3", ref=HF_AND_LLAMACPP, overrides=(("no_rope_layers", [1, 0, 1, 1]),)))
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 1, "q_rope")] == "finding" and st[("impl", "llamacpp", 3, "q_rope")] == "finding"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 2, "q_rope")] == "pass"
    assert not [k for k, s in st.items() if s in ("fail", "error", "unguarded")]


def test_hf_only_sliding_window(run, policy):
    rows = run(policy, family="smollm3", ref=HF_AND_LLAMACPP,
               overrides=(("use_sliding_window", True), ("sliding_window", 4)))
    st = all_statuses(rows)
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 3, "attn_probs")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]
