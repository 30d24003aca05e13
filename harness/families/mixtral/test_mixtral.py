"""mixtral: three-way on mistral's attention with experts in every layer, read by
llama.cpp's llama graph (n_expert > 0); the window llama.cpp ignores on both
sides (none, the tiny config: agree; one the sequence reaches: a finding
against llama.cpp, impl holds to HF); a broken window in impl fails."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, llamacpp_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

WINDOW_5 = (("sliding_window", 5),)


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="mixtral", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_a_window_the_sequence_reaches_is_a_finding_against_llamacpp(run, policy):
    lc = llamacpp_statuses(run(policy, family="mixtral", ref=HF_AND_LLAMACPP, kv="decode", overrides=WINDOW_5))
    assert lc[(0, "q_rope")] == "pass"
    assert lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "mixtral", "impl", "llamacpp", "attn_probs", dict(WINDOW_5), nmse=0.4)
    assert not finding(pol, "mixtral", "impl", "llamacpp", "attn_probs", {}, nmse=0.4)
    assert not finding(pol, "mixtral", "impl", "llamacpp", "q_rope", dict(WINDOW_5), nmse=0.4)


def test_a_broken_window_fails_against_hf(run, policy):
    with applied(registry()["window-off-by-one"]):
        st = all_statuses(run(policy, family="mixtral", ref="hf", kv="decode", overrides=WINDOW_5))
    assert st[("impl", "hf", 0, "q_rope")] == "pass" and st[("impl", "hf", 0, "attn_probs")] == "fail"
