"""harness/policy.py ``Policy.finding``: what a finding excuses -- its pair (either way
round between references), its probes, the reference's config, the dtypes, the lengths and
the place in the dataflow it was measured at -- and never more than its measured size."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.policy import Policy, load_policy

BASE = {"_n": "fam#1", "family": "fam", "candidate": "llamacpp", "reference": "hf", "reason": "a known difference",
        "probes": ["attn_out"], "max_nmse": 1e-6}


def _find(f: dict, **kw):
    args = dict(family="fam", candidate="llamacpp", reference="hf", probe="attn_out", layer_kind="attention",
                config=None, layer=0, nmse=1e-7)
    args.update(kw)
    return Policy("t", {}, findings=[{**BASE, **f}]).finding(**args)


def test_a_finding_excuses_its_pair_at_its_probes_up_to_its_size():
    assert _find({}) == "finding fam#1: a known difference"
    assert _find({}, nmse=1e-6) is not None  # at the size: excused
    assert _find({}, nmse=1.01e-6) is None  # larger: not this finding
    assert _find({}, nmse=None) is None  # no measurement, no excuse
    assert _find({}, probe="q") is None
    assert _find({}, family="other") is None
    assert _find({}, candidate="impl") is None  # a candidate is not a reference
    assert _find({}, candidate="hf", reference="llamacpp") is not None  # between references: either way round


def test_unbounded_lookup_names_the_finding_whatever_the_size():
    assert _find({}, nmse=1.0, bounded=False) is not None


def test_a_finding_holds_only_under_the_reference_config_it_names():
    class Cfg:
        sliding_window = 4
        layer_types = ["sliding_attention", "full_attention"]

    assert _find({"config": {"sliding_window": 4}}, config=Cfg()) is not None
    assert _find({"config": {"sliding_window": 8}}, config=Cfg()) is None
    assert _find({"config": {"sliding_window": 4}}, config=None) is None
    lay = {"layer_config": {"layer_types": "sliding_attention"}}
    assert _find(lay, config=Cfg(), layer=0) is not None
    assert _find(lay, config=Cfg(), layer=1) is None  # another layer's disagreement excuses nothing here


def test_dtypes_lengths_and_later_calls_bound_where_it_holds():
    assert _find({"dtypes": ["q8_k"]}, dtype="q8_k") is not None
    assert _find({"dtypes": ["q8_k"]}, dtype="float32") is None
    assert _find({"tokens_at_most": 64}, tokens=64) is not None
    assert _find({"tokens_at_most": 64}, tokens=65) is None
    assert _find({"tokens_at_most": 64}, tokens=None) is None
    assert _find({"later_call_rows_at_least": 2}, chunks=((4, 2),)) is not None
    assert _find({"later_call_rows_at_least": 2}, chunks=((4, 1, 1),)) is None
    assert _find({"later_call_rows_at_least": 2}, chunks=None) is None


def test_downstream_of_holds_from_that_point_of_the_dataflow_on():
    f = {"downstream_of": "L1.layer_out", "probes": ["attn_out", "layer_out", "final_norm"]}
    assert _find(f, layer=0, probe="layer_out") is None
    assert _find(f, layer=1, probe="attn_out") is None  # in front of L1.layer_out
    assert _find(f, layer=1, probe="layer_out") is not None
    assert _find(f, layer=2, probe="attn_out") is not None
    assert _find(f, layer=None, probe="final_norm") is not None


@pytest.mark.parametrize("f, tokens, depth, bound", [
    ({"max_nmse": 1e-6}, 16, 1, 1e-6),
    ({"max_nmse_per_token": 1e-7}, 16, 1, 1.6e-6),  # grows with the sequence
    ({"max_nmse_per_layer": 1e-7}, 16, 3, 3e-7),  # grows with the layers the probe is past
    ({"max_nmse": 1e-6, "max_nmse_per_token": 1e-7}, 4, 1, 1e-6),  # together: the largest
    ({"max_nmse": 1e-6, "max_nmse_per_token": 1e-7}, 40, 1, 4e-6),
])
def test_the_bound_scales_as_the_finding_says(f, tokens, depth, bound):
    assert Policy.finding_bound(f, tokens, depth) == pytest.approx(bound)


def test_a_per_token_bound_needs_the_case_s_tokens():
    with pytest.raises(ValueError, match="per token"):
        Policy.finding_bound({"_n": "x", "max_nmse_per_token": 1e-7}, None)


def _policy_with(tmp_path, finding: str):
    f = tmp_path / "tol.toml"
    f.write_text("[dtype.float32.default]\nnmse = 1e-10\natol = 1e-4\n\n[[finding]]\n" + finding)
    return load_policy(f)


@pytest.mark.parametrize("finding, says", [
    ("family = 'llama'\ncandidate = 'llamacpp'\nreference = 'hf'\nreason = 'x'\nmax_nmse = 'big'\n",
     "max_nmse must be a positive number"),
    ("family = 'llama'\ncandidate = 'llamacpp'\nreference = 'hf'\nmax_nmse = 1e-6\n", "a written reason"),
    ("family = 'llama'\nreference = 'hf'\nreason = 'x'\n", "must name its pair"),
    # an excuse of impl needs the config it holds under, probes and a size
    ("family = 'llama'\ncandidate = 'impl'\nreference = 'hf'\nreason = 'x'\nmax_nmse = 1e-6\nprobes = ['q']\n",
     "needs config"),
    ("family = 'llama'\ncandidate = 'llamacpp'\nreference = 'hf'\nreason = 'x'\ntokens_at_most = 0\n",
     "tokens_at_most must be an integer"),
    ("family = 'llama'\ncandidate = 'llamacpp'\nreference = 'hf'\nreason = 'x'\nwhen = 1\n", "unknown keys"),
])
def test_a_finding_that_cannot_be_applied_as_written_is_refused(tmp_path, finding, says):
    with pytest.raises(UsageError, match=says):
        _policy_with(tmp_path, finding)


def test_seen_by_is_the_same_disagreement_as_the_candidate_sees_it(tmp_path):
    p = _policy_with(tmp_path, "family = 'llama'\ncandidate = 'llamacpp'\nreference = 'hf'\nreason = 'x'\n"
                               "probes = ['q']\nmax_nmse = 1e-6\nconfig = {attention_bias = true}\n"
                               "[finding.seen_by]\nreference = 'hf'\nprobes = ['k']\nmax_nmse = 1e-8\n")
    mine = [f for f in p.findings if f["_n"].startswith("shared#1")]
    assert [f["_n"] for f in mine] == ["shared#1", "shared#1 (seen by impl)"]
    seen = mine[1]
    assert seen["candidate"] == "impl" and seen["probes"] == ["k"] and seen["config"] == {"attention_bias": True}
    assert seen["reason"] == "x"
