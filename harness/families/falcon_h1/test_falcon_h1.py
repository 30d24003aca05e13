"""falcon_h1: the parallel layer (attention + Mamba-2 on the same normed row, summed)
judged probe by probe against HF's full forward, HF's cached path and llama.cpp
(falcon-h1, on the converter's folded multipliers), each branch at its own output
(``attn_out``, ``ssm_out``) and their sum at ``resid_mid``; the gated norm's other order
(``mamba_norm_before_gate=True``) as the bounded finding it is, both sides shown; planted
bugs in the parallel arrangement and in the multipliers fail where they act."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

PROBES = ("attn_in", "q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out",
          "ssm_out", "resid_mid")
LC_EXPOSED = ("attn_in", "q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_out", "ssm_out", "resid_mid")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented", "finding")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule", [("batched", "5,1,10"), ("paged", "mixed")])
def test_three_way_every_probe_of_both_branches(run, policy, kv, schedule):
    rows = run(policy, family="falcon_h1", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    for layer in (0, 1):
        for probe in PROBES:
            for ref in ("hf", "hf_cached"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        for probe in LC_EXPOSED:
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        assert st[("llamacpp", "hf", layer, "ssm_out")] == "pass"
        assert st[("llamacpp", "hf", layer, "layer_out")] == "pass"
    # the model's multipliers (embedding, lm_head: folded by the converter, applied by HF)
    assert st[("llamacpp", "hf", -1, "embeddings")] == "pass"
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"


NORM_FIRST = (("mamba_norm_before_gate", True),)


@pytest.mark.usefixtures("need_llamacpp")
def test_norm_before_gate_is_a_bounded_finding_on_both_sides(run, policy):
    """HF FalconH1RMSNormGated(norm_before_gate=True) norms, then gates; build_mamba2_layer
    gates, then norms: impl follows HF (pass), llama.cpp is the finding at ssm_out on."""
    st = all_statuses(run(policy, family="falcon_h1", ref=HF_AND_LLAMACPP, schedule="5,1,10", overrides=NORM_FIRST))
    for layer in (0, 1):
        assert st[("impl", "hf", layer, "ssm_out")] == "pass"
        assert st[("impl", "hf", layer, "attn_out")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_out")] == "pass"  # the attention branch agrees
    assert st[("impl", "llamacpp", 0, "ssm_out")] == "finding"
    assert st[("llamacpp", "hf", 0, "ssm_out")] == "finding"
    # and the default order (gate then norm) has no finding: the tiny config sits where both agree
    st = all_statuses(run(policy, family="falcon_h1", ref=HF_AND_LLAMACPP, schedule="5,1,10"))
    assert st[("impl", "llamacpp", 0, "ssm_out")] == "pass"
    assert st[("llamacpp", "hf", 0, "ssm_out")] == "pass"


def test_gate_order_follows_mamba_norm_before_gate():
    """impl's description takes HF's order from the config (FalconH1Mixer.__init__:
    ``FalconH1RMSNormGated(norm_before_gate=config.mamba_norm_before_gate)``)."""
    from harness.families import get

    fam = get("falcon_h1")
    cfg = fam.make_config(dict(NORM_FIRST))
    assert fam.layer_config(cfg, 0).parallel_ssm.gate_order == "norm_then_gate"
    assert fam.layer_config(fam.make_config({}), 0).parallel_ssm.gate_order == "gate_then_norm"


# the parallel branch's mutants live in the registry (harness/kinds/attention/mutants/parallel_ssm.py:
# `conformance mutate` and feature bisection see them, tests/test_mutants.py judges each against HF);
# here each against all three references, with the probe just before it still passing
@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("name,before", [
    ("parallel-ssm-reads-unnormed-row", "attn_out"), ("parallel-ssm-dropped", "ssm_out"),
    ("key-multiplier-dropped", "q"), ("mup-z-segment-dropped", "attn_out")])
def test_planted_bugs_fail_where_they_act(run, policy, name, before):
    mutant = registry()[name]
    first = mutant.first_probe
    with applied(mutant):
        st = all_statuses(run(policy, family="falcon_h1", ref=HF_AND_LLAMACPP, schedule="5,1,10"))
    for ref in ("hf", "hf_cached", "llamacpp"):
        assert st[("impl", ref, 0, first)] == "fail", (ref, first)
        assert st[("impl", ref, 0, before)] == "pass", (ref, before)


@pytest.mark.usefixtures("need_llamacpp")
def test_attention_bias_is_hf_only(run, policy, monkeypatch):
    """falcon-h1.cpp loads attn_output.bias (:91) and never adds it (build_attn(..., wo, NULL,
    ...) at :152-154): attention_bias=true is refused for llama.cpp in one line, and impl is
    judged against HF; false (the tiny config's) runs three-way (the tests above). Without
    the refusal llama.cpp runs the file and computes another model: its attn_out is o_proj's
    output less the bias."""
    from harness.families import get

    fam = get("falcon_h1")
    # the attention multipliers 1 (the converter folds them into the biases too,
    # conversion/falcon_h1.py:68-75): the dropped o_proj bias is the only difference left
    over = (("attention_bias", True), ("attention_in_multiplier", 1.0), ("key_multiplier", 1.0),
            ("attention_out_multiplier", 1.0))
    why = fam.lc_refusal(fam.make_config(dict(over)))
    assert why and "attention_bias=true" in why and "falcon-h1.cpp" in why and "\n" not in why
    assert fam.hf_refusal(fam.make_config(dict(over))) is None
    assert fam.lc_refusal(fam.make_config({})) is None
    rows = run(policy, family="falcon_h1", ref="hf", overrides=over)
    assert "qkv_bias" in rows[0]["features"].split(";") and not _bad(rows), _bad(rows)[:3]
    monkeypatch.setattr(fam, "lc_refusal", lambda config: None)
    st = all_statuses(run(policy, family="falcon_h1", ref="llamacpp", overrides=over))
    for probe in ("q", "k", "v", "attn_probs", "attn_branch"):  # o_proj's input agrees ...
        assert st[("impl", "llamacpp", 0, probe)] == "pass", probe
    assert st[("impl", "llamacpp", 0, "attn_out")] == "fail"  # ... its output lacks the bias
