"""exaone4: three-way on EXAONE 4's attention (no input norm, branch post-norm,
per-head QK norm); the trap of llama.cpp's depth-gated hybrid attention, on both
sides of the switch: at 64 layers it windows and leaves the full layers NoPE as
HF does (agree), at any other depth it ignores the window (a finding), and at
64 layers without a window it still makes every 4th layer NoPE (a finding)."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

WINDOW_5 = (("sliding_window", 5),)
DEEP = (("num_hidden_layers", 64),)  # exaone4.cpp load_arch_hparams: `if (hparams.n_layer() == 64)`


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="exaone4", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s in ("pass", "not-exposed") for s in st.values()), \
        [k for k, s in st.items() if s not in ("pass", "not-exposed")][:4]


def test_window_and_nope_follow_hf_layer_types():
    fam = get("exaone4")
    cfgs = fam.layer_configs(fam.make_config({}))
    assert [c.window for c in cfgs] == [None] * 4 and all(c.rope is not None for c in cfgs)
    cfgs = fam.layer_configs(fam.make_config(dict(WINDOW_5)))  # Exaone4Config: pattern 4, LLLG
    assert [c.window and c.window.size for c in cfgs] == [5, 5, 5, None]
    assert [c.rope is not None for c in cfgs] == [True, True, True, False]  # the full layer is NoPE
    assert fam.make_config(dict(DEEP)).layer_types == ["full_attention"] * 64


def test_below_64_layers_llamacpp_ignores_the_window(run, policy):
    st = all_statuses(run(policy, family="exaone4", ref=HF_AND_LLAMACPP, kv="decode", overrides=WINDOW_5))
    assert all(s in ("pass", "not-exposed") for (c, r, *_), s in st.items() if (c, r) == ("impl", "hf"))
    assert st[("llamacpp", "hf", 0, "q_rope")] == "pass" and st[("llamacpp", "hf", 0, "attn_probs")] == "finding"
    assert st[("impl", "llamacpp", 3, "q")] == "pass" and st[("impl", "llamacpp", 3, "q_rope")] == "finding"


def test_at_64_layers_llamacpp_windows_and_leaves_the_full_layers_unrotated(run, policy):
    # the other side of the switch: the same window at the 32B's depth, impl (= HF) vs llama.cpp
    # at every layer, past the window (8 tokens > 5)
    st = all_statuses(run(policy, family="exaone4", ref="llamacpp", kv="decode", tokens=8,
                          overrides=WINDOW_5 + DEEP))
    bad = [k for k, s in st.items() if s not in ("pass", "not-exposed")]
    assert not bad, bad[:4]
    assert st[("impl", "llamacpp", 63, "q_rope")] == "pass" and st[("impl", "llamacpp", 62, "attn_probs")] == "pass"


def test_at_64_layers_without_a_window_llamacpp_still_leaves_every_4th_layer_unrotated(run, policy):
    # ref all: impl's finding against llama.cpp holds only where HF passes impl (the guard)
    st = all_statuses(run(policy, family="exaone4", ref=HF_AND_LLAMACPP, kv="decode", tokens=6, overrides=DEEP))
    assert all(s in ("pass", "not-exposed") for (c, r, i, p), s in st.items() if c == "impl" and i >= 0 and i % 4 != 3)
    assert all(s in ("pass", "not-exposed") for (c, r, *_), s in st.items() if (c, r) == ("impl", "hf"))
    assert st[("impl", "llamacpp", 3, "q")] == "pass" and st[("impl", "llamacpp", 3, "q_rope")] == "finding"
    assert st[("impl", "llamacpp", 63, "q_rope")] == "finding"


def test_the_depth_findings_need_their_settings(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "exaone4", "impl", "llamacpp", "q_rope", dict(WINDOW_5), nmse=0.7, layer=3)
    assert not finding(pol, "exaone4", "impl", "llamacpp", "q_rope", {}, nmse=0.7, layer=3)
    assert not finding(pol, "exaone4", "impl", "llamacpp", "q_rope", dict(WINDOW_5 + DEEP), nmse=0.7, layer=3)
    assert finding(pol, "exaone4", "impl", "llamacpp", "q_rope", dict(DEEP), nmse=0.4, layer=3)
    assert not finding(pol, "exaone4", "impl", "llamacpp", "q_rope", dict(DEEP), nmse=0.4, layer=2)  # before L3


def test_a_rotated_nope_layer_fails_against_hf(run, policy):
    with applied(registry()["nope-layer-rotated"]):
        st = all_statuses(run(policy, family="exaone4", ref="hf", kv="decode", overrides=WINDOW_5))
    assert st[("impl", "hf", 0, "q_rope")] == "pass" and st[("impl", "hf", 3, "q_rope")] == "fail"


def test_a_missing_post_norm_fails(run, policy):
    with applied(registry()["post-norm-missing"]):
        st = all_statuses(run(policy, family="exaone4", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_branch")] == "pass" and st[("impl", "llamacpp", 0, "attn_out")] == "fail"
