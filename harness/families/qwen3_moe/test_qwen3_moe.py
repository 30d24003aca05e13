"""qwen3_moe: three-way in every KV mode on qwen3's attention with experts in
every layer; the router's normalisation switch on both sides (true: the
released checkpoints, both agree; false: HF's config default, which llama.cpp
never computes -- a finding); the attention's QK norm is impl's to get right."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

UNNORMED = (("norm_topk_prob", False),)


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="qwen3_moe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_unnormalised_routing_is_a_finding_between_the_references(run, policy):
    rows = run(policy, family="qwen3_moe", ref=HF_AND_LLAMACPP, kv="decode", overrides=UNNORMED)
    st = all_statuses(rows)
    # teacher-forced impl sees each reference's own input: it agrees with both
    assert all(s == "pass" for (c, _r, *_), s in st.items() if c == "impl")
    ref = {k[2:]: s for k, s in st.items() if k[:2] == ("llamacpp", "hf")}
    assert ref[(0, "attn_out")] == "pass"  # the attention agrees, the FFN does not
    assert ref[(0, "layer_out")] == ref[(1, "layer_out")] == "finding"


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "qwen3_moe", "llamacpp", "hf", "layer_out", dict(UNNORMED), nmse=0.02, layer=1)
    assert not finding(pol, "qwen3_moe", "llamacpp", "hf", "layer_out", {}, nmse=0.02, layer=1)
    # bounded by its measured size
    assert not finding(pol, "qwen3_moe", "llamacpp", "hf", "layer_out", dict(UNNORMED), nmse=0.5, layer=1)


def test_a_broken_qk_norm_fails_against_llamacpp(run, policy):
    with applied(registry()["k-norm-takes-q-weight"]):
        st = all_statuses(run(policy, family="qwen3_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 0, "k_rope")] == "fail"


def test_every_layer_slides_when_use_sliding_window(run, policy, monkeypatch):
    """HF Qwen3-MoE slides every layer once use_sliding_window is set (no layer_types, no
    max_window_layers): impl does too and passes HF; with qwen3's layer_types rule in its
    place (what it did before issue 39) the window is lost and attn_probs fails."""
    from harness.families.qwen3 import Qwen3
    from harness.families.qwen3_moe import Qwen3Moe

    kw = dict(family="qwen3_moe", ref="hf", kv="decode", overrides=(("use_sliding_window", True),
                                                                     ("sliding_window", 5)))
    st = all_statuses(run(policy, **kw))
    assert st and set(st.values()) <= {"pass", "not-exposed"}, st
    monkeypatch.setattr(Qwen3Moe, "window", Qwen3.window)
    st = all_statuses(run(policy, **kw))
    assert st[("impl", "hf", 0, "attn_probs")] == "fail", st
