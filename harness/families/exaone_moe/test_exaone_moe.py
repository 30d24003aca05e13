"""exaone_moe: three-way in every KV mode on the per-head QK norm, the window
and the NoPE full layer, with experts after a dense lead; each of those broken
in impl fails against llama.cpp; the gating key llama.cpp's graph requires and
the converter writes only from a key HF does not read (scoring_func) on both
sides: refused in one line, and llama.cpp indeed does not load the file
without it."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

FULL = 3  # the tiny config's one full (NoPE) layer: sliding_window_pattern 4


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="exaone_moe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert ("impl", "llamacpp", FULL, "q_rope") in st and ("impl", "llamacpp", FULL, "q") in st


@pytest.mark.parametrize("mutant,layer,probe", [("k-norm-takes-q-weight", 0, "k_rope"),
                                                ("window-off-by-one", 0, "attn_probs"),
                                                ("nope-layer-rotated", FULL, "q_rope")])
def test_a_broken_decoration_fails_against_llamacpp(run, policy, mutant, layer, probe):
    with applied(registry()[mutant]):
        st = all_statuses(run(policy, family="exaone_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", layer, "q")] == "pass" and st[("impl", "llamacpp", layer, probe)] == "fail"


def test_no_scoring_func_is_refused_on_both_sides(run, policy, monkeypatch):
    fam = get("exaone_moe")
    over = (("scoring_func", None),)
    msg = fam.lc_refusal(fam.make_config(dict(over)))
    assert msg and msg.startswith("scoring_func unset") and "\n" not in msg
    assert fam.lc_refusal(fam.make_config({})) is None
    rows = run(policy, family="exaone_moe", ref="hf", kv="decode", overrides=over)
    assert rows and all(r["status"] == "pass" for r in rows)
    # the refusal is llama.cpp's own: without it, exaone-moe.cpp does not load the file
    monkeypatch.setattr(fam, "lc_refusal", lambda config: None)
    rows = run(policy, family="exaone_moe", ref="llamacpp", kv="decode", overrides=over)
    assert [r["status"] for r in rows] == ["error"], [r["status"] for r in rows][:4]
