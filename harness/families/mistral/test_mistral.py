"""mistral: the window HF applies to every layer and llama.cpp's llama graph
ignores -- both sides of it: a window the sequence never reaches (HF's default
4096, the tiny config's None) agrees three-way, one it reaches is a finding
against llama.cpp while impl holds to HF; a broken window in impl fails."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, llamacpp_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

DEFAULT_WINDOW = (("sliding_window", 4096),)  # MistralConfig's default (Mistral-7B-v0.1)
WINDOW_5 = (("sliding_window", 5),)


def test_hf_default_window_is_4096_and_the_tiny_config_names_none():
    from transformers import MistralConfig

    assert MistralConfig().sliding_window == 4096
    assert get("mistral").make_config({}).sliding_window is None
    lcs = get("mistral").layer_configs(get("mistral").make_config(dict(DEFAULT_WINDOW)))
    assert {lc.window.size for lc in lcs} == {4096}  # every layer, as MistralModel.forward masks


def test_a_window_the_sequence_never_reaches_agrees(run, policy):
    rows = run(policy, family="mistral", ref=HF_AND_LLAMACPP, kv="paged", overrides=DEFAULT_WINDOW)
    assert "sliding_window" in rows[0]["features"].split(";")
    st = all_statuses(rows)
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_a_window_the_sequence_reaches_is_a_finding_against_llamacpp(run, policy):
    lc = llamacpp_statuses(run(policy, family="mistral", ref=HF_AND_LLAMACPP, kv="decode", overrides=WINDOW_5))
    assert lc[(0, "q_rope")] == "pass"  # nothing before the mask differs
    assert lc[(0, "attn_probs")] == lc[(1, "attn_probs")] == "finding"


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "mistral", "impl", "llamacpp", "attn_probs", dict(WINDOW_5), nmse=0.4)
    assert not finding(pol, "mistral", "impl", "llamacpp", "attn_probs", {}, nmse=0.4)
    # before the mask it excuses nothing
    assert not finding(pol, "mistral", "impl", "llamacpp", "q_rope", dict(WINDOW_5), nmse=0.4)


def test_a_broken_window_fails_against_hf(run, policy):
    with applied(registry()["window-off-by-one"]):
        st = all_statuses(run(policy, family="mistral", ref="hf", kv="decode", overrides=WINDOW_5))
    assert st[("impl", "hf", 0, "q_rope")] == "pass" and st[("impl", "hf", 0, "attn_probs")] == "fail"
