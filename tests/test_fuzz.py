"""``conformance fuzz``: the generator draws valid cases, a failure is shrunk and
reproduced by the command it prints, the regression files it writes are cases
the matrix (and this file) run, and the spec examples catch a broken impl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import families, fuzz
from harness.case import Case
from harness.cli import build_parser, case_from_args, main
from harness.matrix import parse_spec
from harness.mutants import applied, registry
from harness.kinds.attention.mutants.features4 import SPEC_MUTANTS

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from harness.testing import HF_AND_LLAMACPP

ROOT = Path(__file__).resolve().parents[1]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz.case_strategy(["llama", "qwen2", "gemma2", "deepseek_v2", "qwen3_next", "llama4", "smollm3"]))
def test_drawn_cases_are_valid_and_their_command_reproduces_them(case):
    case.validate()
    argv = fuzz.repro_command(case).split()[1:]  # drop "conformance"
    again = case_from_args(build_parser().parse_args(argv))
    assert again.case_id() == case.case_id()
    # and the regression group the fuzzer would write runs exactly this case
    spec = parse_spec(fuzz.regression_group(case, "why", 1), "fuzz-test")
    assert [c.case_id() for c in spec.cases] == [case.case_id()]


def test_spec_examples_pass_clean_and_a_mutant_is_caught_and_shrunk():
    stats = fuzz.HuntStats()
    fuzz.hunt("spec", fuzz.spec_strategy(), fuzz.run_spec, 4, 0, stats, None, log=lambda m: None)
    assert stats.examples > 20 and not stats.failures, [o.why for o, _ in stats.failures]
    m = SPEC_MUTANTS[0]  # a layer with both gates applies only one
    stats = fuzz.HuntStats()
    with applied(m):
        fuzz.hunt("spec", fuzz.spec_strategy(), fuzz.run_spec, 15, 0, stats, None, shrink_s=15, log=lambda m: None)
        assert stats.failures, "the spec examples did not catch a layer applying one of its two gates"
        out, ex = stats.failures[0]
        assert ex.cfg.q_gate_interleaved and ex.cfg.output_gate and "attn_branch" in out.why
        # shrunk: the decorations the failure does not need are off
        assert ex.cfg.window is None and ex.cfg.sub_norm is None and len(ex.lengths) == 1
        # the printed command replays it: failing under the mutant ...
        cmd = fuzz.spec_repro(ex)
        payload = cmd.split("--replay-spec ", 1)[1].strip("'")
        assert main(["fuzz", "--replay-spec", payload]) == 1
    # ... and passing without it
    assert main(["fuzz", "--replay-spec", payload]) == 0


def test_a_three_way_failure_is_reported_with_its_command():
    """A mutant in impl makes a generated llama case fail; the outcome names the
    first divergence and the command reproduces the case."""
    from harness.policy import load_policy

    case = Case(family="llama", ref="hf", kv="paged", schedule="3,1", tokens=4, seqs=2, page_size=2,
                overrides=(("num_attention_heads", 4), ("num_key_value_heads", 2)))
    assert not fuzz.run_three_way(case, load_policy()).failed
    with applied(registry()["gqa-head-map"]):
        out = fuzz.run_three_way(case, load_policy())
    assert out.failed and "attn_probs" in out.why
    assert "--kv paged --schedule 3,1" in fuzz.repro_command(case) and "--set num_key_value_heads=2" in \
        fuzz.repro_command(case)


def test_fuzz_cli_reports_throughput_and_pair_coverage(tmp_path, capsys):
    rc = main(["fuzz", "--budget", "3s", "--spec-share", "1", "--no-record", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "cases/min" in out and "feature-pair coverage" in out
    res = json.loads((tmp_path / "fuzz.json").read_text())
    assert res["examples"] > 0 and len(res["pairs"]) > 50 and res["failures"] == []


@pytest.mark.parametrize("argv,msg", [
    (["fuzz", "--budget", "ten"], "is not a duration"),
    (["fuzz", "--family", "lama"], "unknown family 'lama'"),
    (["fuzz", "--ref", "both"], "unknown reference"),
    (["fuzz", "--replay-spec", "{}"], "not a spec example"),
])
def test_bad_input_is_one_line_and_exit_2(argv, msg, capsys, tmp_path):
    assert main(argv + ["--no-record", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


SPEC_REGRESSIONS = ROOT / "fixtures" / "matrix" / "fuzz_spec_regressions.jsonl"


@pytest.mark.parametrize("line", SPEC_REGRESSIONS.read_text().splitlines() if SPEC_REGRESSIONS.exists() else [])
def test_recorded_spec_regressions_pass(line):
    ex = fuzz.spec_from_dict(json.loads(line)["example"])
    out = fuzz.run_spec(ex)
    assert not out.failed, out.why


def test_recorded_three_way_regressions_parse():
    p = ROOT / "fixtures" / "matrix" / "fuzz_regressions.toml"
    if not p.exists():
        pytest.skip("no three-way regression recorded yet")
    spec = parse_spec(p.read_text(), str(p))
    assert len(spec.cases) == p.read_text().count("[[group]]")


def _drawn_schedules(name: str) -> list[str]:
    seen = []

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(fuzz.case_strategy([name]))
    def draw(case):
        seen.append(case.schedule)

    draw()
    return seen


def test_a_family_may_keep_the_fuzz_to_named_schedules(monkeypatch):
    """``fuzz_space["schedules"]`` keeps a family's draws to the named schedules; without
    it chunks are drawn -- minimax's again, since HF's cached path, which crashes on a
    multi-row call after the first, sits out of such a case (MiniMax.hf_cached_schedule_refusal)."""
    fam = families.get("minimax")
    assert "schedules" not in fam.fuzz_space
    assert any("," in s for s in _drawn_schedules("minimax"))
    monkeypatch.setattr(fam, "fuzz_space", {**fam.fuzz_space, "schedules": ("prefill", "decode")})
    assert set(_drawn_schedules("minimax")) == {"prefill", "decode"}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(fuzz.case_strategy(["gemma3n", "hrm_text"]))
def test_gemma3n_and_hrm_text_draw_only_what_llamacpp_can_say(case):
    """gemma3n: >= 21 layers sharing KV from layer 20 (gemma3n.cpp:7: num_kv_shared_layers =
    n - 20, where HF's sources are llama.cpp's), the sizes llama.cpp hard-codes never drawn
    (llama-hparams.h:264-267); hrm_text: every stack count >= 1 (hrm-text.cpp asserts it).
    A bias (no o / gate bias in either graph) runs against HF alone."""
    case.validate()
    ov = dict(case.overrides)
    if case.family == "gemma3n":
        from harness.families.gemma3n import LC_FIXED

        assert ov["num_hidden_layers"] >= 21 and ov["num_kv_shared_layers"] == ov["num_hidden_layers"] - 20
        assert not set(ov) & (set(LC_FIXED) | {"vocab_size_per_layer_input", "activation_sparsity_pattern"})
    else:
        assert all(ov[k] >= 1 for k in ("num_hidden_layers", "H_cycles", "L_cycles"))
    assert case.ref == ("hf" if ov.get("attention_bias") else "all")


def test_kv_eviction_with_shared_kv_is_a_refused_draw():
    """gemma3n's shared KV with --kv-evict: impl's source would evict rows its reader still
    needs (impl/runner.py _check_source) -- bad input before any capture (found by conformance
    fuzz as an impl error row), so the fuzzer discards the draw."""
    from harness.policy import load_policy

    out = fuzz.run_three_way(Case(family="gemma3n", ref=HF_AND_LLAMACPP, kv="decode", tokens=2, evict=True), load_policy())
    assert fuzz.is_refused(out) and "--kv-evict with KV shared across layers" in out.why, out.why


def test_the_fuzz_turns_yarn_on():
    """The mla_yarn knob on a family whose tiny config rotates plainly sets rope_type yarn
    (the YaRN keys alone changed nothing: youtu's YaRN went unfuzzed)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from harness import fuzz
    from harness.families import get

    fam = get("youtu")
    keys = set(fam.settable_keys())
    seen = set()

    @settings(max_examples=40, database=None, derandomize=True)
    @given(st.data())
    def one(data):
        ov: dict = {}
        fuzz._draw_knob(data.draw, st, "mla_yarn", fam, fam.fuzz_space, 16, ov, keys)
        seen.add(ov.get("rope_parameters.rope_type"))

    one()
    assert {"yarn", "default"} <= seen


def test_the_fuzz_draws_every_familys_norm_eps_at_released_values():
    """Every family that declares a norm epsilon gets it drawn (the key was open in 81 families:
    coverage_open.json), at 1e-6 / 1e-5 or left at the tiny config's; a family with two eps
    keys gets both the same value; one without any gets none."""
    from hypothesis import given, settings

    from harness import fuzz

    def drawn(family):
        seen = []

        @settings(max_examples=30, database=None, derandomize=True)
        @given(fuzz.case_strategy([family]))
        def one(case):
            seen.append({k: v for k, v in case.overrides if k in fuzz.NORM_EPS_KEYS})

        one()
        return seen

    llama = drawn("llama")
    assert {d.get("rms_norm_eps") for d in llama} == {None, 1e-6, 1e-5}
    assert {k for d in drawn("starcoder2") for k in d} == {"norm_epsilon"}
    assert all(not d for d in drawn("dbrx"))  # dbrx declares no eps key
