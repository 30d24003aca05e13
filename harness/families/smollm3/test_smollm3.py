"""smollm3: NoPE every fourth layer (llama.cpp: fixed at 4), the llama Q/K
permutation, and the HF-only settings llama.cpp cannot express."""

from __future__ import annotations

import pytest

from harness.testing import (all_statuses, assert_llamacpp_fails_first_at_q, assert_llamacpp_rotation_step_finding,
                      finding, run)

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_nope_layer_is_compared_on_both_sides(policy):
    rows = run(policy, family="smollm3", ref="all")
    assert "nope_layers" in rows[0]["features"].split(";")
    st = all_statuses(rows)
    # layer 3 is NoPE: llama.cpp has no ROPE node there, its q_rope is the reshaped Qcur
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 3, "q_rope")] == "pass"
        assert st[("impl", ref, 3, "attn_probs")] == "pass"


def test_broken_qk_permutation_fails_at_q(policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("smollm3"), "permute_qk", False)
    st = all_statuses(run(policy, family="smollm3", ref="all"))
    assert_llamacpp_fails_first_at_q(st)
    assert st[("impl", "llamacpp", 0, "v")] == "pass"


def test_hf_only_nope_interval(policy):
    """no_rope_layer_interval=2: HF leaves layer 1 unrotated, llama.cpp (step 4) rotates it."""
    assert_llamacpp_rotation_step_finding(run(policy, family="smollm3", ref="all",
                                              overrides=(("no_rope_layer_interval", 2),)))


def test_the_interval_finding_needs_its_setting(policy):
    """The interval finding is keyed on the setting: the same disagreement without it fails."""
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "smollm3", "impl", "llamacpp", "q_rope", {"no_rope_layer_interval": 2}, layer=1)
    assert not finding(pol, "smollm3", "impl", "llamacpp", "q_rope", {}, layer=1)
    assert not finding(pol, "smollm3", "impl", "llamacpp", "q_rope", {"no_rope_layer_interval": 4}, layer=1)


def test_hf_only_sliding_window(policy):
    rows = run(policy, family="smollm3", ref="all",
               overrides=(("use_sliding_window", True), ("sliding_window", 4)))
    st = all_statuses(rows)
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 3, "attn_probs")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]
