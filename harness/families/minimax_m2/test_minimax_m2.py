"""minimax_m2: three-way in every KV mode on MiniMax-M2's attention (the QK norm
over the whole projected row, partial neox RoPE) with sigmoid-routed experts and
their selection bias in every layer; each of those caught where it is broken,
and the converter's gating key."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


@pytest.mark.parametrize("kv", ["paged", "batched"])
def test_three_way_passes(run, policy, kv):
    # decode runs in the default matrix (families = "*")
    st = all_statuses(run(policy, family="minimax_m2", ref=HF_AND_LLAMACPP, kv=kv))
    assert {c for c, *_ in st} == {"impl", "hf_cached", "llamacpp"}
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_the_qk_norm_spans_the_whole_row(run, policy):
    # the per-head statistic (qwen3's form) on MiniMax-M2's whole-row norm weights
    with applied(registry()["qk-norm-row-per-head"]):
        st = all_statuses(run(policy, family="minimax_m2", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"


def test_a_partial_rotary_bug_fails(run, policy):
    with applied(registry()["partial-rotary-pairs-from-tail"]):
        st = all_statuses(run(policy, family="minimax_m2", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"


def test_a_dropped_expert_bias_fails_between_the_references(run, policy, monkeypatch):
    fam = get("minimax_m2")
    cls = type(fam)

    def zeroed(name, data, config, variant=None):
        for n, d in cls.gguf_convert(fam, name, data, config, variant):
            yield n, (d * 0 if "e_score_correction" in n else d)

    monkeypatch.setattr(fam, "gguf_convert", zeroed)
    st = all_statuses(run(policy, family="minimax_m2", ref=HF_AND_LLAMACPP, kv="decode"))
    # the attention agrees; the first MoE output (layer 0's) does not
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass" and st[("llamacpp", "hf", 0, "layer_out")] == "fail"


def test_without_the_sigmoid_scoring_key_llamacpp_is_refused(cli_main, run, policy, capsys):
    rc = cli_main(["run", "--family", "minimax_m2", "--ref", "llamacpp", "--set", "scoring_func=null"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "scoring_func None" in err
    st = all_statuses(run(policy, family="minimax_m2", ref="hf", overrides=(("scoring_func", None),)))
    assert st and all(s == "pass" for s in st.values())
