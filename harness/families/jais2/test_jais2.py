"""jais2: three-way on llama's attention under a biased LayerNorm; the
LayerNorm's bias and mean-centring and the neox rotation verified against llama.cpp (broken in
impl, each fails there); the required biases of jais2.cpp on both sides (a
bias-free config is refused in one line, and llama.cpp indeed does not load
its file)."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

NO_BIAS = (("attention_bias", False),)


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="jais2", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert ("impl", "llamacpp", 0, "q_rope") in st and ("impl", "llamacpp", 0, "attn_in") in st


@pytest.mark.parametrize("mutant,probe", [("layernorm-bias-dropped", "attn_in"), ("layernorm-mean-kept", "attn_in"),
                                          ("rope-layout-swapped", "q_rope")])
def test_a_broken_decoration_fails_against_llamacpp(run, policy, mutant, probe):
    with applied(registry()[mutant]):
        st = all_statuses(run(policy, family="jais2", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, probe)] == "fail"


def test_a_bias_free_config_is_hf_only(run, policy, monkeypatch):
    fam = get("jais2")
    why = fam.lc_refusal(fam.make_config(dict(NO_BIAS)))
    assert why and "attention_bias=False" in why and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None
    rows = run(policy, family="jais2", ref="hf", kv="decode", overrides=NO_BIAS)
    assert rows and all(r["status"] == "pass" for r in rows)
    # the refusal is llama.cpp's own: without it, jais2.cpp does not load the file
    monkeypatch.setattr(fam, "lc_refusal", lambda config: None)
    rows = run(policy, family="jais2", ref="llamacpp", kv="decode", overrides=NO_BIAS)
    assert [r["status"] for r in rows] == ["error"] and "attn_output.bias" in rows[0]["reason"]
