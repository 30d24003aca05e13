"""``conformance mutate``: the mutation self-test's own behaviour -- a mutant is
killed and the probe that killed it named; a survivor is reported with the cases
that should have caught it; a score below the bar exits 1; a stale mutant is an
error, never a survivor or a kill."""

from __future__ import annotations

import json

import pytest

import harness.mutants as mutants_pkg
from harness.cli import main
from harness.mutants import Mutant, registry

QWEN2 = 'name = "tiny"\nfamilies = ["qwen2"]\nreferences = ["hf"]\n'
LLAMA = ('name = "tiny"\nfamilies = ["llama"]\nvariants = "default"\nreferences = ["hf"]\n'
         'kv_modes = ["decode", "paged"]\n')

# an EQUIVALENT mutant: it changes impl's source, not what impl computes -- it must survive
SURVIVOR = Mutant("test-equivalent", "qkv_bias", "impl.attention",
                  'q = q + w["bq"]',
                  'q = (q + w["bq"]) * 1.0',
                  {"family": "qwen2"}, "q", doc="multiplies q by one")
STALE = Mutant("test-stale", "gqa", "impl.attention", "this snippet is not in impl", "x", {"family": "llama"}, "q")


def _spec(tmp_path, text):
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "spec.toml"
    p.write_text(text)
    return str(p)


def _mutate(tmp_path, spec_text, *args):
    out = tmp_path / "run"
    rc = main(["mutate", _spec(tmp_path, spec_text), "--out", str(out), "-j", "1", *args])
    res = json.loads((out / "mutation.json").read_text()) if (out / "mutation.json").exists() else None
    return rc, res, out


@pytest.fixture
def extra_mutants(monkeypatch):
    """The registry plus the test's own mutants (in-process, -j 1, where they apply)."""
    reg = {**registry(), SURVIVOR.name: SURVIVOR, STALE.name: STALE}
    monkeypatch.setattr(mutants_pkg, "registry", lambda: reg)
    return reg


def test_mutate_kills_a_mutant_and_names_the_probe(tmp_path, capsys):
    rc, res, out = _mutate(tmp_path, LLAMA, "--mutants", "scale-squared,paged-block-table-off-by-one")
    assert rc == 0
    assert res["score"] == 1.0 and res["killed"] == res["total"] == 2
    by = {e["name"]: e for e in res["mutants"]}
    e = by["scale-squared"]
    assert e["status"] == "killed" and e["killed_by_spec"]
    assert (e["reference"], e["layer"], e["probe"]) == ("hf", 0, "attn_probs")
    assert e["killed_by"].startswith("llama/numpy-cpu-float32/decode")
    assert e["cases_failed"] == e["cases_run"] == 3  # a core mutant: both spec cases and its own
    p = by["paged-block-table-off-by-one"]
    # only the paged case exercises kv_paged (then its own paged case)
    assert p["cases_run"] == 2 and "/paged/" in p["killed_by"] and p["probe"] == "attn_probs"
    assert p["probe_as_declared"] is True or p["killed_by"] != p["own_case"]
    text = capsys.readouterr().out
    assert "mutation score 2/2 = 100.0%" in text
    md = (out / "mutation.md").read_text()
    assert "| scale-squared | attn_scale (core) | killed |" in md
    assert (out / "mutation_rows.parquet").exists()


def test_a_survivor_is_reported_with_the_cases_that_should_have_caught_it(tmp_path, extra_mutants, capsys):
    rc, res, out = _mutate(tmp_path, QWEN2, "--mutants", "test-equivalent,qkv-bias-dropped")
    assert rc == 1  # 1 of 2 < 100%
    by = {e["name"]: e for e in res["mutants"]}
    s = by["test-equivalent"]
    assert s["status"] == "survived" and s["cases_failed"] == 0
    assert s["should_catch"] == ["qwen2/numpy-cpu-float32/decode/mixed/hf/s0/t16"]
    assert by["qkv-bias-dropped"]["status"] == "killed" and by["qkv-bias-dropped"]["probe"] == "q"
    assert res["score"] == 0.5
    md = (out / "mutation.md").read_text()
    assert "## Not killed" in md and "cases that should have caught it: `qwen2/" in md
    # --min-score lowers the bar
    rc2, res2, _ = _mutate(tmp_path / "b", QWEN2, "--mutants", "test-equivalent,qkv-bias-dropped",
                           "--min-score", "0.5")
    assert rc2 == 0 and res2["score"] == 0.5


def test_a_decoration_no_case_exercises_runs_every_case_and_says_so(tmp_path):
    rc, res, out = _mutate(tmp_path, QWEN2, "--mutants", "softcap-dropped", "--no-mutant-cases")
    assert rc == 1
    (e,) = res["mutants"]
    assert e["status"] == "survived" and e["targeted"] is False
    assert e["cases_run"] == 1 and e["should_catch"] == []
    assert "no case of the spec exercises softcap" in (out / "mutation.md").read_text()
    # with its own declared case (the default) the same mutant is killed -- by that case only
    rc, res, out = _mutate(tmp_path / "b", QWEN2, "--mutants", "softcap-dropped")
    (e,) = res["mutants"]
    assert rc == 0 and e["status"] == "killed" and not e["killed_by_spec"]
    assert e["killed_by"].startswith("gemma2/") and e["probe_as_declared"] is True
    assert "by its own case only" in (out / "mutation.md").read_text()


def test_a_stale_mutant_is_an_error_and_not_killed(tmp_path, extra_mutants):
    rc, res, _ = _mutate(tmp_path, LLAMA, "--mutants", "test-stale,scale-squared", "--min-score", "0.5")
    assert rc == 1  # stale is an error whatever the bar
    by = {e["name"]: e for e in res["mutants"]}
    assert by["test-stale"]["status"] == "stale" and "occurs 0 times" in by["test-stale"]["error"]
    assert res["stale"] == ["test-stale"] and res["killed"] == 1 and res["total"] == 2


def test_first_kill_stops_a_mutant_at_its_first_kill(tmp_path):
    rc, res, _ = _mutate(tmp_path, LLAMA, "--mutants", "scale-squared", "--first-kill")
    (e,) = res["mutants"]
    assert rc == 0 and e["status"] == "killed" and e["cases_run"] == 1


@pytest.mark.parametrize("args,msg", [
    (["--mutants", "no-such-mutant"], "unknown mutant"),
    (["--decoration", "no_such_tag"], "unknown decoration"),
    (["--min-score", "1.5"], "--min-score"),
    (["-j", "0"], "--jobs"),
])
def test_bad_input_exits_2(tmp_path, capsys, args, msg):
    assert main(["mutate", _spec(tmp_path, LLAMA), "--out", str(tmp_path / "o"), *args]) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_mutants_apply_in_worker_processes(tmp_path):
    """-j 2: each task applies its mutant in the worker that runs it."""
    rc, res, _ = _mutate(tmp_path, QWEN2, "--mutants", "qkv-bias-dropped,gqa-head-map", "--no-mutant-cases")
    rc2 = main(["mutate", _spec(tmp_path, QWEN2), "--out", str(tmp_path / "par"), "-j", "2",
                "--mutants", "qkv-bias-dropped,gqa-head-map", "--no-mutant-cases"])
    par = json.loads((tmp_path / "par" / "mutation.json").read_text())
    assert rc == rc2 == 0
    assert [(e["name"], e["status"], e["probe"]) for e in par["mutants"]] == \
        [(e["name"], e["status"], e["probe"]) for e in res["mutants"]]


def test_every_decoration_the_families_exercise_has_a_mutant_or_a_reason(policy):
    """At least one mutant per decoration impl implements (issue 8), or a written reason."""
    from harness import families
    from harness.case import Case, CaseRun
    from harness.features import SPEC_DECORATIONS
    from harness.kinds.attention.mutants.coverage import NO_MUTANT

    seen = set()
    for name, fam in families.registry().items():
        for variant in fam.variants or (None,):
            seen |= set(CaseRun(Case(family=name, variant=variant), policy).features)
    seen |= set(CaseRun(Case(family="llama", overrides=(("num_key_value_heads", 1),)), policy).features)
    covered = {m.decoration for m in registry().values()}
    lacking = {t for t in seen & set(SPEC_DECORATIONS) - covered if t not in ("kv_decode", "kv_batched")}
    assert lacking == set(NO_MUTANT), lacking
