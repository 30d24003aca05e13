"""phimoe: three-way, where llama.cpp computes another model -- an RMS norm
plus bias for HF's LayerNorm, softmax-renormalised routing for sparsemixer --
a finding from L0.attn_in on, bounded; impl holds to HF everywhere; impl with
llama.cpp's norm passes against llama.cpp and fails against HF (the finding's
cause, shown from both sides); a dropped QKV bias fails; llama.cpp's required
biases refused in one line."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_with_the_norm_and_router_finding(run, policy):
    st = all_statuses(run(policy, family="phimoe", ref=HF_AND_LLAMACPP, kv="paged"))
    # impl computes HF's model: every row against HF passes
    assert all(s == "pass" for (c, r, *_), s in st.items() if c == "impl" and r in ("hf", "hf_cached"))
    ref = {k[2:]: s for k, s in st.items() if k[:2] == ("llamacpp", "hf")}
    assert ref[(0, "layer_in")] == "pass"  # the embeddings agree; the first norm does not
    assert ref[(0, "attn_in")] == ref[(1, "layer_out")] == ref[(-1, "logits")] == "finding"
    lc = {k[2:]: s for k, s in st.items() if k[:2] == ("impl", "llamacpp")}
    assert lc[(0, "attn_in")] == lc[(1, "attn_heads")] == "finding"
    assert not [k for k, s in st.items() if s not in ("pass", "finding", "not-exposed")]


def test_llamacpp_s_norm_is_an_rms_norm_plus_bias(run, policy, monkeypatch):
    """impl switched to phi3.cpp's build_norm(..., LLM_NORM_RMS) with the bias: every
    probe passes against llama.cpp and attn_in fails against HF's LayerNorm."""
    monkeypatch.setattr(type(get("phimoe")), "input_norm_kind", "rms")
    st = all_statuses(run(policy, family="phimoe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert all(s in ("pass", "not-exposed") for (c, r, *_), s in st.items() if (c, r) == ("impl", "llamacpp"))
    assert st[("impl", "hf", 0, "attn_in")] == "fail"


def test_the_finding_is_bounded(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "phimoe", "llamacpp", "hf", "attn_in", {}, nmse=0.03, layer=0)
    assert not finding(pol, "phimoe", "llamacpp", "hf", "attn_in", {}, nmse=3, layer=0)
    # the softmax's bound grows with the keys (2 per token), the rest's does not
    assert finding(pol, "phimoe", "llamacpp", "hf", "attn_probs", {}, nmse=3, layer=0)
    assert not finding(pol, "phimoe", "llamacpp", "hf", "attn_probs", {}, nmse=40, layer=0)
    assert finding(pol, "phimoe", "impl", "llamacpp", "q", {}, nmse=0.03, layer=0)
    assert not finding(pol, "phimoe", "impl", "llamacpp", "layer_out", {}, nmse=0.03, layer=0)
    # not before its first probe: the embeddings agree
    assert not finding(pol, "phimoe", "llamacpp", "hf", "layer_in", {}, nmse=0.03, layer=0)


def test_a_dropped_qkv_bias_fails_against_hf(run, policy):
    with applied(registry()["qkv-bias-dropped"]):
        st = all_statuses(run(policy, family="phimoe", ref="hf", kv="decode"))
    assert st[("impl", "hf", 0, "attn_in")] == "pass" and st[("impl", "hf", 0, "q")] == "fail"


def test_llamacpp_s_required_biases_are_refused_in_one_line():
    fam = get("phimoe")
    assert fam.lc_refusal(fam.make_config({})) is None
    for over in ({"attention_bias": False}, {"lm_head_bias": False}):
        why = fam.lc_refusal(fam.make_config(over))
        assert why and "\n" not in why and "--ref hf" in why
        assert fam.hf_refusal(fam.make_config(over)) is None
