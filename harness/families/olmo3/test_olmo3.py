"""olmo3: olmo2's attention on three sliding layers of four, three-way with the
window reached; the sliding layers' own theta, which llama.cpp's olmo2 graph
reads and never uses (a finding on the sliding layers only); a broken window
fails."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, llamacpp_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

SLIDING_THETA_1E4 = (("rope_parameters.sliding_attention", {"rope_type": "default", "rope_theta": 10000.0}),)


def test_windows_on_three_of_four_layers_agree(run, policy):
    rows = run(policy, family="olmo3", ref=HF_AND_LLAMACPP, kv="batched")
    assert {"sliding_window", "qk_norm_row", "post_norm"} <= set(rows[0]["features"].split(";"))
    st = all_statuses(rows)
    assert not [k for k, s in st.items() if s not in ("pass", "not-exposed")]
    for layer in range(4):  # the window (4) is reached: every sliding layer masks
        assert st[("impl", "llamacpp", layer, "attn_probs")] == "pass"


def test_a_sliding_theta_of_its_own_is_a_finding_on_the_sliding_layers(run, policy):
    lc = llamacpp_statuses(run(policy, family="olmo3", ref=HF_AND_LLAMACPP, kv="paged", overrides=SLIDING_THETA_1E4))
    for layer in (0, 1, 2):
        assert lc[(layer, "k")] == "pass" and lc[(layer, "q_rope")] == "finding"
    assert lc[(3, "q_rope")] == "pass"  # the full layer rotates with the base both read


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "olmo3", "impl", "llamacpp", "q_rope", dict(SLIDING_THETA_1E4), nmse=0.2)
    assert not finding(pol, "olmo3", "impl", "llamacpp", "q_rope", {}, nmse=0.2)


def test_a_broken_window_fails_against_both(run, policy):
    with applied(registry()["window-off-by-one"]):
        st = all_statuses(run(policy, family="olmo3", ref=HF_AND_LLAMACPP, kv="decode"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q_rope")] == "pass" and st[("impl", ref, 0, "attn_probs")] == "fail"
