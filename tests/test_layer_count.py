"""The layer count, varied (issue 39: ``num_hidden_layers`` was open in 77 families):
the fuzz draws one more layer than the tiny config's for every family, the per-layer
lists the tiny config spells out cycled to it; a count a reference cannot run is
refused with its line, not a crash (docs/measurements/2026-12-07-layer-count.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from harness import families, fuzz
from harness.cli import build_parser, case_from_args
from harness.pytest_fixtures import run
from harness.testing import statuses


def test_the_per_layer_lists_follow_the_count():
    """hy_v3's tiny config spells out mlp_layer_types for its 2 layers: at 3 the pattern
    repeats (a list of another length is left alone), and the config class accepts it."""
    hy = families.get("hy_v3")
    ov = fuzz.layer_count_overrides(hy, 3)
    assert ov == {"num_hidden_layers": 3, "mlp_layer_types": ["dense", "sparse", "dense"]}
    cfg = hy.make_config(ov)
    assert cfg.num_hidden_layers == 3 and list(cfg.mlp_layer_types) == ["dense", "sparse", "dense"]
    assert fuzz.layer_count_overrides(families.get("llama"), 5) == {"num_hidden_layers": 5}
    assert fuzz.layer_count_key(families.get("gpt2")) == "n_layer"  # GPT-2's own name
    # falcon_h1's mlp_multipliers (gate, down) is as long as its 2 layers by chance: left as it is
    assert fuzz.layer_count_overrides(families.get("falcon_h1"), 3) == {"num_hidden_layers": 3}


@pytest.mark.parametrize("family", ["llama", "hy_v3", "mpt"])
def test_the_fuzz_draws_one_more_layer_and_the_command_reproduces_it(family):
    """Every family with a layer count gets it drawn (the tiny's, or one more, never fewer);
    the repro command of a case with a cycled list (compact JSON: one argv word) is the case."""
    fam = families.get(family)
    key = fuzz.layer_count_key(fam)
    seen = []

    @settings(max_examples=30, database=None, derandomize=True, deadline=None)
    @given(fuzz.case_strategy([family]))
    def one(case):
        ov = dict(case.overrides)
        seen.append(ov.get(key))
        argv = fuzz.repro_command(case).split()[1:]
        assert case_from_args(build_parser().parse_args(argv)).case_id() == case.case_id()

    one()
    assert set(seen) == {None, fam.tiny[key] + 1}, seen


def test_hy_v3_at_one_more_layer_passes_three_way(policy, need_llamacpp):
    """The cycled pattern (dense, sparse, dense) is one model to all three: every row a pass."""
    hy = families.get("hy_v3")
    rows = run(policy, family="hy_v3", ref="all", kv="decode", tokens=5,
               overrides=tuple(fuzz.layer_count_overrides(hy, 3).items()))
    st = statuses(rows)
    assert {r for (r, _, _) in st} >= {"hf", "llamacpp"} and set(st.values()) <= {"pass", "not-exposed",
                                                                                  "not-implemented"}, st
    assert max(r["layer"] for r in rows if r["reference"] == "llamacpp") == 2  # the third layer was compared


def test_counts_llamacpp_aborts_on_are_refused_with_the_line():
    """llama4 with fewer layers than llama.cpp's NoPE step (its temperature input is then never
    allocated: llama4.cpp:121) and laguna with a dense layer after a sparse one (the converter
    writes a leading dense count only) are refused for llama.cpp in one line; the counts
    llama.cpp runs are not."""
    from harness.references import get

    lc = get("llamacpp")
    l4 = families.get("llama4")
    assert "llama4.cpp:121" in lc.config_refusal(l4, l4.make_config({"num_hidden_layers": 3}))
    assert lc.config_refusal(l4, l4.make_config({"num_hidden_layers": 5})) is None
    lg = families.get("laguna")
    bad = fuzz.layer_count_overrides(lg, 5)  # the plain cycle: dense, sparse x3, dense
    assert "leading dense" in lc.config_refusal(lg, lg.make_config(bad))
    ok = dict(bad, mlp_layer_types=["dense"] + ["sparse"] * 4)
    assert lc.config_refusal(lg, lg.make_config(ok)) is None


def test_the_cli_refuses_such_a_count_in_one_line(capsys):
    from harness.cli import main

    assert main(["run", "--family", "llama4", "--ref", "llamacpp", "--tokens", "4", "--set",
                 "num_hidden_layers=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NoPE" in err[0], err


def test_mlx_refuses_a_pattern_without_the_layer_kind_it_looks_up(need_mlx):
    """mlx-lm's olmo3 looks up its first full-attention layer (layer_types.index): at 3 of the
    tiny's 4 layers there is none, and the refusal names the line; at 5 there is one."""
    from harness.references import get

    mlx = get("mlx")
    o3 = families.get("olmo3")
    why = mlx.refusal(o3, o3.make_config({"num_hidden_layers": 3}))
    assert why and "olmo3.py:" in why and "'full_attention'" in why, why
    assert mlx.refusal(o3, o3.make_config({"num_hidden_layers": 5})) is None


def test_key_sweep_refuses_a_bad_layer_count(capsys):
    import importlib.util
    from pathlib import Path

    p = Path(__file__).resolve().parents[1] / "scripts" / "key_sweep.py"
    spec = importlib.util.spec_from_file_location("key_sweep", p)
    ks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ks)
    assert ks.main(["--layers", "zero"]) == 2
    assert "not a layer count" in capsys.readouterr().err
    assert ks.main([]) == 2


def _drawn(family, keys, n=30):
    seen = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None)
    @given(fuzz.case_strategy([family]))
    def one(case):
        seen.append({k: v for k, v in case.overrides if k in keys})

    one()
    return seen


def test_the_fuzz_draws_the_context_length():
    """The context length (open in 66 families) is drawn at 4096 or left at the tiny config's;
    glm_moe_dsa draws it with index_topk, so its layers stay ones impl implements."""
    assert {d.get("max_position_embeddings") for d in _drawn("llama", fuzz.CONTEXT_KEYS)} == {None, 4096}
    assert {d.get("n_positions") for d in _drawn("gpt2", fuzz.CONTEXT_KEYS)} == {None, 4096}
    dsa = _drawn("glm_moe_dsa", ("max_position_embeddings", "index_topk"))
    assert all(d.get("index_topk") == d.get("max_position_embeddings") for d in dsa)
    assert {d.get("max_position_embeddings") for d in dsa} == {512, 4096}


def test_minicpm3_longer_context_is_llamacpps_finding_and_impl_passes(policy, need_llamacpp):
    """At max_position_embeddings 4096 over LongRoPE's original 256, HF scales q_pe / k_pe by the
    attention factor 1.22 and llama.cpp (whose converter writes none) by 1: a finding with both
    lines; impl, which follows HF, passes against it."""
    rows = run(policy, family="minicpm3", ref="hf,llamacpp", kv="decode", tokens=6,
               overrides=(("max_position_embeddings", 4096),))
    st = statuses(rows)
    assert all(s in ("pass", "not-exposed") for (r, _, _), s in st.items() if r == "hf"), st
    lc = {p: s for (r, _, p), s in st.items() if r == "llamacpp"}
    assert lc["k_pe"] == "finding" and "finding" in set(lc.values()) and not {"fail", "error"} & set(lc.values())


def test_the_fuzz_draws_the_rope_base_where_no_knob_of_the_family_does():
    """rope_theta (open in 29 families) is drawn at 1e6 where the family's knobs leave it and its
    config has one RoPE table; a family with a table per layer type (gemma3) gets none, one whose
    theta knob draws it keeps that knob's values."""
    assert {d.get("rope_parameters.rope_theta") for d in _drawn("gemma2", ("rope_parameters.rope_theta",))} \
        == {None, fuzz.ROPE_THETA}
    assert all(not d for d in _drawn("gemma3", ("rope_parameters.rope_theta",)))
    assert fuzz.ROPE_THETA not in {d.get("rope_parameters.rope_theta")
                                   for d in _drawn("qwen3", ("rope_parameters.rope_theta",))}


@pytest.mark.parametrize("family,first", [("gemma2", "q_rope"), ("stablelm", "q_rope"), ("minicpm3", "k_pe")])
def test_a_converter_without_a_rope_base_is_a_finding_and_impl_passes(policy, need_llamacpp, family, first):
    """gemma2, stablelm and minicpm3's converters write no rope.freq_base: at theta 1e6 llama.cpp
    rotates at its default 10000 -- a finding from the first rotated probe on, with both lines;
    impl, which follows HF, passes against HF."""
    rows = run(policy, family=family, ref="hf,llamacpp", kv="decode", tokens=6,
               overrides=(("rope_parameters.rope_theta", fuzz.ROPE_THETA),))
    st = statuses(rows)
    assert all(s in ("pass", "not-exposed") for (r, _, _), s in st.items() if r == "hf"), st
    lc = {(layer, p): s for (r, layer, p), s in st.items() if r == "llamacpp"}
    assert lc[(0, first)] == "finding" and not {"fail", "error"} & set(lc.values()), lc
