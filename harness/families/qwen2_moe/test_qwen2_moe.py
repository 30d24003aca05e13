"""qwen2_moe: three-way on qwen2's attention with routed and shared experts; two
switches HF has and llama.cpp's graph lacks, each on both sides: the top-k
renormalisation (false, HF's default: both agree; true: a finding) and the
sliding window (off: agree; reached: a finding against llama.cpp, impl holds to HF)."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, llamacpp_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

NORMED = (("norm_topk_prob", True),)
WINDOW_5 = (("use_sliding_window", True), ("sliding_window", 5))


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="qwen2_moe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_renormalised_routing_is_a_finding_between_the_references(run, policy):
    st = all_statuses(run(policy, family="qwen2_moe", ref=HF_AND_LLAMACPP, kv="decode", overrides=NORMED))
    assert all(s == "pass" for (c, *_), s in st.items() if c == "impl")
    ref = {k[2:]: s for k, s in st.items() if k[:2] == ("llamacpp", "hf")}
    assert ref[(0, "attn_out")] == "pass" and ref[(0, "layer_out")] == ref[(1, "layer_out")] == "finding"


def test_the_findings_need_their_settings(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "qwen2_moe", "llamacpp", "hf", "layer_out", dict(NORMED), nmse=0.015, layer=1)
    assert not finding(pol, "qwen2_moe", "llamacpp", "hf", "layer_out", {}, nmse=0.015, layer=1)
    assert finding(pol, "qwen2_moe", "impl", "llamacpp", "attn_probs", dict(WINDOW_5), nmse=0.4)
    assert not finding(pol, "qwen2_moe", "impl", "llamacpp", "attn_probs", {}, nmse=0.4)


def test_the_window_is_hf_s_layer_types():
    fam = get("qwen2_moe")
    assert [lc.window for lc in fam.layer_configs(fam.make_config({}))] == [None, None]
    sizes = [lc.window and lc.window.size for lc in fam.layer_configs(fam.make_config(dict(WINDOW_5)))]
    assert sizes == [5, None]  # Qwen2MoeConfig.__post_init__: (i + 1) % 2 layers slide


def test_a_window_the_sequence_reaches_is_a_finding_against_llamacpp(run, policy):
    lc = llamacpp_statuses(run(policy, family="qwen2_moe", ref=HF_AND_LLAMACPP, kv="decode", overrides=WINDOW_5))
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == "finding"


def test_a_dropped_qkv_bias_fails_against_llamacpp(run, policy):
    with applied(registry()["qkv-bias-dropped"]):
        st = all_statuses(run(policy, family="qwen2_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "fail"
