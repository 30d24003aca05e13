"""Feature bisection names the feature each mutant breaks.

For every mutant of the registry: apply it, run its declared case, switch the
case's features off one at a time (then in halves) -- through config fields HF
honours, case fields (KV backing, variant), weights neutralised in the seeded
model, or HF modules replaced by the identity with impl told the same -- and
check that the smallest set whose removal makes the case pass contains the
mutant's decoration. A mutant whose decoration cannot be switched off carries a
``bisect_note`` saying why; for those, bisection must name NO feature (rather
than a wrong one) and, where the note says so, list the decoration as
unswitchable. Every switch is itself checked: alone, on a family's clean case,
it must pass -- a switch the reference does not honour would prove nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness import families
from harness.bisect import _LAST as ROPE_IDENTITY
from harness.bisect import _switched, describe_features, feature_bisect, first_divergence, switches_for
from harness.case import Case, CaseRun
from harness.errors import UsageError
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP

MUTANTS = registry()


def _case(m) -> Case:
    kw = dict(m.case)
    kw.setdefault("ref", "hf")
    kw["overrides"] = tuple(tuple(x) for x in kw.get("overrides", ()))
    return Case(**kw)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_feature_bisection_names_the_mutated_feature(policy, name):
    m = MUTANTS[name]
    case = _case(m)
    # the features of the clean case: a mutant in the code that builds impl's configs
    # (the RoPE frequency table) would hide the very feature it breaks from the tags
    clean = CaseRun(case, policy).features
    with applied(m):
        res = feature_bisect(case, policy, log=lambda msg: None, features=clean)
    text = describe_features(res)
    named = [t for s in [res["smallest"] or []] + res["alternatives"] for t in s]
    assert res.get("note") != "the case passes with every feature on", f"mutant {name} does not act on its case"
    if not m.bisect_note:
        assert m.decoration in named, f"{name}: feature bisection named {named or 'nothing'}\n{text}"
        return
    # a documented exception: nothing named (never a wrong feature), and the note is still true
    assert res["smallest"] is None, f"{name} has a bisect_note but bisection named {named}: remove the note?\n{text}"
    if "unswitchable" in m.bisect_note:
        assert m.decoration in res["unswitchable"], text
        assert f"cannot switch off: {m.decoration}" in text or m.decoration in text


def _clean_case(name: str) -> Case:
    return Case(family=name, ref="hf")


@pytest.mark.parametrize("family", sorted(families.registry()))
def test_every_switch_alone_passes_on_the_clean_case(policy, family):
    """A switch is honest only if both sides honour it: alone, on the family's clean
    case, impl must still agree with HF (and the case must still compare something)."""
    case = _clean_case(family)
    run = CaseRun(case, policy)
    usable, _ = switches_for(case, run)
    for tag, sw in sorted(usable.items()):
        rows = CaseRun(_switched(case, [sw]), policy).rows()
        d = first_divergence(rows)
        assert d is None, f"{family}: switch {tag} ({sw.what}) breaks the clean case: {d}"
        assert any(r["status"] == "pass" for r in rows if r["candidate"] == "impl"), (family, tag)
        if sw.kind in ("case", "module") or (sw.kind == "config" and tag not in ROPE_IDENTITY):
            # a switch that says it takes its feature away must take it away (only the
            # neutralisations -- RoPE turned to the identity, weights zeroed -- leave the tag)
            assert tag in sw.removes, (family, tag, sw.removes)


@pytest.mark.parametrize("family,tag", [("qwen2", "qkv_bias"), ("starcoder2", "o_bias"), ("gpt_oss", "sinks"),
                                        ("falcon_h1", "parallel_ssm")])
def test_weight_switches_hold_for_llamacpp_too(policy, need_llamacpp, family, tag):
    """A weight switch changes the seeded model, from which the GGUF is exported: both
    references see it, and impl still agrees with both."""
    case = Case(family=family, ref=HF_AND_LLAMACPP, kv="paged")
    usable, _ = switches_for(case, CaseRun(case, policy))
    assert usable[tag].kind == "weights"
    rows = CaseRun(_switched(case, [usable[tag]]), policy).rows()
    assert first_divergence(rows) is None
    assert first_divergence(rows, candidate="llamacpp") is None
    assert {r["reference"] for r in rows if r["candidate"] == "impl" and r["status"] == "pass"} == {"hf", "hf_cached",
                                                                                              "llamacpp"}


def test_falcon_h1_parallel_branch_switches(policy):
    """Feature bisection can switch each parallel-branch feature off on its own: the muP
    scalars and the mup vector through HF's own config fields (harness/families/_switches.py),
    the branch itself by zeroing FalconH1Mixer.out_proj (harness/kinds/attention/switches.py),
    which leaves the attention branch bit for bit as it was."""
    from harness.families._switches import BRANCH_MULTIPLIERS

    case = Case(family="falcon_h1", ref="hf")
    on = CaseRun(case, policy)
    assert {"parallel_ssm", "branch_multipliers", "mup_vector"} <= set(on.features)
    usable, _ = switches_for(case, on)
    assert usable["branch_multipliers"].overrides == {k: 1.0 for k in BRANCH_MULTIPLIERS}
    assert usable["branch_multipliers"].removes == ["branch_multipliers"]
    assert usable["mup_vector"].overrides == {"ssm_multipliers": [1.0] * 5}
    assert usable["mup_vector"].removes == ["mup_vector"]
    assert usable["parallel_ssm"].kind == "weights"
    off = CaseRun(_switched(case, [usable["parallel_ssm"]]), policy)
    a, b = on.capture("hf").probes, off.capture("hf").probes
    _ = off.base_model  # (the capture may come from the cache without building the model)
    assert off.switched == {"parallel_ssm": 2}  # out_proj of both layers
    for i in (0, 1):
        assert abs(a[f"L{i}.ssm_out"]).max() > 1e-3 and not abs(b[f"L{i}.ssm_out"]).max()
    assert (a["L0.attn_out"] == b["L0.attn_out"]).all()


def test_a_switched_case_is_its_own_case(policy):
    """switch_off is part of the case's identity and of the capture's cache key: the
    switched model is never read back from the unswitched capture."""
    case = Case(family="qwen2")
    off = replace(case, switch_off=("qkv_bias",))
    assert off.case_id() != case.case_id() and off.case_id().endswith("off=qkv_bias")
    assert Case.from_dict(off.to_dict()) == off
    a, b = CaseRun(case, policy), CaseRun(off, policy)
    qa, qb = a.capture("hf").probes["L0.q"], b.capture("hf").probes["L0.q"]
    _ = b.base_model  # (the capture may come from the cache without building the model)
    assert b.switched == {"qkv_bias": 6}  # q, k, v biases of both layers
    assert abs(qa - qb).max() > 1e-3


def test_a_module_switch_is_refused_against_llamacpp(policy):
    """A module switch replaces an HF module, which llama.cpp never sees. (Every reference that
    runs HF's modules is named -- hf and, since it joined, hf_cached -- so match the first and the
    advice, not the whole list.)"""
    with pytest.raises(UsageError, match=r"which only HF transformers( or .*)? sees; use --ref hf"):
        _ = CaseRun(Case(family="qwen3", ref=HF_AND_LLAMACPP, kv="paged", switch_off=("qk_norm_head",)), policy).layer_cfgs


def test_bisect_command_names_the_feature(capsys):
    from harness.cli import main

    with applied(MUTANTS["sink-dropped"]):
        rc = main(["bisect", "--family", "gpt_oss", "--features"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "smallest set of features whose removal makes the case pass: sinks" in out
    assert "sinks [weights: sink logits at -1e4" in out
