"""Candidates (issue 17): any engine judged by the harness -- found by its entry
point, fed the same layer data impl is, judged by the same verdict rules; dumps
of engines outside Python; real engines (transformers' SDPA / FlexAttention,
llama.cpp's flash attention, impl with torch's SDPA kernel)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError

from conftest import run
from harness.testing import HF_AND_LLAMACPP

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _mine(rows):
    from harness.verdict import candidate_rows

    return candidate_rows(rows)


def _statuses(rows):
    return {(r["reference"], r["layer"], r["probe"]): r["status"] for r in _mine(rows)}


def _cli(*argv, env=None, timeout=900):
    """The CLI in a subprocess, from this checkout (as a user runs it)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "harness.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=e, timeout=timeout)


# ---------------------------------------------------------------- the registry
def test_every_builtin_is_an_entry_point_that_loads():
    import tomllib

    from harness import candidates

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][candidates.GROUP]
    assert {"impl", "hf-sdpa", "hf-flex", "llamacpp-fa", "llamacpp-fa-kv-f16", "llamacpp-fa-kv-q8_0",
            "torch-sdpa-kernel"} <= set(declared)
    for name in declared:
        c = candidates.get(name)
        assert isinstance(c, candidates.Candidate) and c.name == name and c.description


def test_unknown_candidate_is_bad_input(tmp_path):
    from harness.case import Case

    with pytest.raises(UsageError, match="did you mean 'hf-sdpa'"):
        Case(family="llama", candidate="hf-sdpaa").validate()
    p = _cli("run", "--family", "llama", "--candidate", "nope", "--out", str(tmp_path / "r"))
    assert p.returncode == 2 and "unknown candidate 'nope'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r").exists()
    with pytest.raises(UsageError, match="use --backend torch"):
        Case(family="llama", candidate="torch-sdpa-kernel").validate()


def test_candidate_findings_need_config_probes_and_size(tmp_path):
    from harness.policy import load_policy

    base = (ROOT / "fixtures" / "tolerance.toml").read_text()
    bad = base + ('\n[[finding]]\nfamily = "llama"\ncandidate = "llamacpp-fa"\nreference = "hf"\n'
                  'probes = ["attn_heads"]\nmax_nmse = 1e-6\nreason = "no config selector"\n')
    (tmp_path / "p.toml").write_text(bad)
    with pytest.raises(UsageError, match="needs config"):
        load_policy(tmp_path / "p.toml")
    good = bad.replace('max_nmse = 1e-6\n', 'max_nmse = 1e-6\nconfig = { hidden_act = "silu" }\n')
    (tmp_path / "p.toml").write_text(good)
    assert any(f["candidate"] == "llamacpp-fa" and f["reason"] == "no config selector"
               for f in load_policy(tmp_path / "p.toml").findings)


# ---------------------------------------------------------------- a plug-in by entry point
@pytest.fixture(scope="module")
def tiny_engine_installed(tmp_path_factory):
    """examples/tiny_engine installed as a user would install their engine -- into a
    scratch target, never into the project's venv -- and put on the path."""
    target = tmp_path_factory.mktemp("tiny-engine-site")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(EXAMPLES / "tiny_engine")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert list(target.glob("tiny_engine-*.dist-info"))
    return target


@pytest.mark.llamacpp
def test_a_plugin_is_found_by_its_entry_point_and_judged(tiny_engine_installed, tmp_path, need_llamacpp):
    import pandas as pd

    env = {"PYTHONPATH": str(tiny_engine_installed)}
    ls = _cli("list", env=env)
    assert ls.returncode == 0 and "tiny-engine " in ls.stdout and "tiny-engine-rope-bug" in ls.stdout
    # the same call without the package on the path does not know it
    assert "tiny-engine" not in _cli("list").stdout

    ok = _cli("run", "--family", "llama", "--candidate", "tiny-engine", "--ref", HF_AND_LLAMACPP, "--out", str(tmp_path / "ok"),
              env=env)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    rows = pd.read_parquet(tmp_path / "ok" / "rows.parquet")
    mine = rows[rows["candidate"] == "tiny-engine"]
    assert set(mine["reference"]) == {"hf", "hf_cached", "llamacpp"}
    assert (mine["status"] == "pass").sum() >= 30 and set(mine["status"]) == {"pass"}
    # no impl row: impl was not run (the others are the references judged against each other)
    assert set(rows["candidate"]) == {"tiny-engine", "hf_cached", "llamacpp"}

    bug = _cli("bisect", "--family", "llama", "--candidate", "tiny-engine-rope-bug", "--ref", "hf", env=env)
    assert bug.returncode == 1, bug.stdout[-2000:] + bug.stderr[-2000:]
    assert "candidate: tiny-engine-rope-bug" in bug.stdout
    assert "first divergence vs hf: layer 0, probe q_rope (fail)" in bug.stdout
    assert "last probe that still agreed: layer 0, v" in bug.stdout


def test_a_plugin_refuses_what_it_does_not_compute(tiny_engine_installed, policy, monkeypatch):
    """gemma2 has a softcap the tiny engine lacks: a skipped case that says so, never a pass."""
    monkeypatch.syspath_prepend(str(tiny_engine_installed))
    import harness.candidates as cands

    cands.registry.cache_clear()
    cands._get.cache_clear()
    try:
        rows = run(policy, family="gemma2", ref="hf", candidate="tiny-engine")
    finally:
        cands.registry.cache_clear()
        cands._get.cache_clear()
    assert [r["status"] for r in rows] == ["skipped"]
    assert "does not compute layer 0's" in rows[0]["reason"]


# ---------------------------------------------------------------- dumps
def _writer():
    spec = importlib.util.spec_from_file_location("dump_writer", EXAMPLES / "dump_writer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.llamacpp
def test_dump_round_trip_and_a_planted_error(tmp_path, need_llamacpp, capsys):
    from harness.cli import main

    case = tmp_path / "case"
    assert main(["export-case", "--family", "llama", "--ref", HF_AND_LLAMACPP, "--out", str(case)]) == 0
    data = json.loads((case / "case.json").read_text())
    assert data["format"] == "attn-conformance-case/1" and data["references"].keys() == {"hf", "hf_cached", "llamacpp"}
    assert (case / "model.gguf").is_file() and (case / "hf" / "config.json").is_file()
    assert data["layers"][0]["expected_probes"][-2:] == ["attn_out", "resid_mid"]

    writer = _writer()
    assert writer.main([str(case), str(tmp_path / "dump")]) == 0
    capsys.readouterr()
    assert main(["judge", str(tmp_path / "dump"), "--out", str(tmp_path / "j")]) == 0
    out = capsys.readouterr().out
    assert all(f"tiny-engine-dump vs {ref}" in out for ref in ("hf", "hf_cached", "llamacpp")) and "fail" not in out

    # the same dump with one tensor 0.1% off fails there, against every reference (hf_cached included)
    assert writer.main([str(case), str(tmp_path / "bad"), "--plant-error", "L1.q_rope"]) == 0
    assert main(["judge", str(tmp_path / "bad"), "--out", str(tmp_path / "jb")]) == 1
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "jb" / "rows.parquet")
    bad = rows[rows["status"] == "fail"]
    assert set(zip(bad["reference"], bad["layer"], bad["probe"])) == {("hf", 1, "q_rope"), ("hf_cached", 1, "q_rope"),
                                                                     ("llamacpp", 1, "q_rope")}


def test_a_broken_dump_is_bad_input(tmp_path, capsys):
    from harness.cli import main

    d = tmp_path / "dump"
    d.mkdir()
    assert main(["judge", str(d)]) == 2
    assert "has no manifest.json" in capsys.readouterr().err
    (d / "manifest.json").write_text(json.dumps({"format": "attn-conformance-dump/1", "engine": {"name": "hf"},
                                                 "case": {"family": "llama"}, "tokens": [[1]], "dtype": "float32",
                                                 "runs": {"hf": "hf"}}))
    assert main(["judge", str(d)]) == 2
    assert "must not be impl or a reference's" in capsys.readouterr().err


# ---------------------------------------------------------------- torch-sdpa-kernel
WINDOW = (("use_sliding_window", True), ("sliding_window", 5), ("max_window_layers", 1))
NO_WINDOW = (("sliding_window", 16),)  # gemma2's even layers slide over 4 keys; 16 of 16 tokens: no window acts


@pytest.mark.parametrize("family,overrides,broken", [
    ("llama", (), None),
    ("gemma2", NO_WINDOW, "softcap"),
    ("gemma2", (("attn_logit_softcapping", None),), "sliding window"),
    ("gpt_oss", (), "sinks"),
    ("bloom", (), "ALiBi"),
    ("qwen2", WINDOW, "sliding window"),
])
def test_torch_sdpa_kernel_breaks_the_decorations_sdpa_cannot_express(policy, family, overrides, broken):
    """impl's body with torch's SDPA as its kernel: the plain attention passes; a
    decoration SDPA has no parameter for is dropped silently by the swap, and the
    harness fails it where it acts -- attn_heads (attn_probs: SDPA exposes none)."""
    rows = run(policy, family=family, ref="hf", backend="torch", overrides=overrides,
               candidate="torch-sdpa-kernel")
    st = _statuses(rows)
    assert all(s == "not-exposed" for (_, _, p), s in st.items() if p == "attn_probs")
    if broken is None:
        assert set(st.values()) == {"pass", "not-exposed"}
        return
    from harness.bisect import first_divergence

    d = first_divergence(rows, candidate="torch-sdpa-kernel")
    assert d is not None and d["probe"] == "attn_heads", (broken, d)
    # everything upstream of the kernel still agrees on that layer
    assert st[("hf", d["layer"], "q_rope")] == "pass"


def test_torch_sdpa_kernel_passes_once_the_decoration_is_off(policy):
    """The failures above are the softcap's and the window's: gemma2 without both passes."""
    rows = run(policy, family="gemma2", ref="hf", backend="torch",
               overrides=(("attn_logit_softcapping", None),) + NO_WINDOW, candidate="torch-sdpa-kernel")
    assert set(_statuses(rows).values()) == {"pass", "not-exposed"}


# ---------------------------------------------------------------- mutants reach a plug-in
def test_impl_mutants_are_caught_on_a_plugin_running_impl_body(policy):
    """torch-sdpa-kernel runs impl's body: a mutant of that body fails it the same
    way it fails impl; a mutant of the kernel it replaces does not reach it, and
    mutate says so instead of counting a survivor."""
    from harness import candidates
    from harness.commands.mutate import applies, for_candidate, run_mutation
    from harness.matrix import parse_spec
    from harness.mutants import registry

    reg = registry()
    cand = candidates.get("torch-sdpa-kernel")
    assert applies(reg["qkv-bias-dropped"], cand) is None
    assert "replaces impl.attention.attend" in applies(reg["causal-mask-leaks"], cand)
    spec = parse_spec('families = ["qwen2"]\nreferences = ["hf"]\nschedules = ["prefill"]\n', "inline")
    spec = for_candidate(spec, "torch-sdpa-kernel")
    assert {c.backend for c in spec.cases} == {"torch"}
    res = run_mutation(spec, [reg["qkv-bias-dropped"], reg["rope-layout-swapped"]], 1, None, mutant_cases=False,
                       candidate="torch-sdpa-kernel")
    assert res["killed"] == res["total"] == 2
    by = {m["name"]: m for m in res["mutants"]}
    assert by["qkv-bias-dropped"]["probe"] == "q" and by["rope-layout-swapped"]["probe"] == "q_rope"


# ---------------------------------------------------------------- transformers' attention paths
def test_hf_sdpa_against_eager(policy):
    rows = run(policy, family="llama", ref="hf", candidate="hf-sdpa")
    st = _statuses(rows)
    assert st[("hf", 0, "attn_probs")] == "not-exposed"
    assert {s for k, s in st.items() if k[2] != "attn_probs"} == {"pass"}
    assert sum(s == "pass" for s in st.values()) >= 18


@pytest.mark.parametrize("family,why", [
    ("gemma2", "_supports_sdpa = False  # sdpa does not support softcapping (transformers/models/gemma2/"),
    ("bloom", "transformers keeps attn_implementation='eager' for BloomForCausalLM"),
])
def test_hf_sdpa_says_where_transformers_has_no_sdpa_path(policy, family, why):
    rows = run(policy, family=family, ref="hf", candidate="hf-sdpa")
    assert [r["status"] for r in rows] == ["skipped"] and why in rows[0]["reason"]


@pytest.mark.slow
def test_hf_flex_runs_on_the_cpu(policy):
    """FlexAttention on the CPU: torch 2.13 compiles it through inductor (gcc); the
    softcap reaches it as a score_mod (gemma2)."""
    rows = run(policy, family="gemma2", ref="hf", candidate="hf-flex")
    st = _statuses(rows)
    assert st[("hf", 0, "attn_probs")] == "not-exposed"
    assert {s for k, s in st.items() if k[2] != "attn_probs"} == {"pass"}


# ---------------------------------------------------------------- llama.cpp's flash attention
@pytest.mark.llamacpp
def test_llamacpp_fa_against_the_plain_path_hf_and_the_oracle(policy, need_llamacpp):
    from harness.case import Case, CaseRun

    r = CaseRun(Case(family="gemma2", ref=HF_AND_LLAMACPP, candidate="llamacpp-fa"), policy)
    rows = r.rows()
    mine = _mine(rows)
    assert {x["reference"] for x in mine} == {"hf", "hf_cached", "llamacpp"}
    assert not [x for x in mine if x["status"] not in ("pass", "not-exposed")]
    judged = [x for x in mine if x["status"] == "pass"]
    # free-running: its layer inputs and the logits are judged too, through the float64 oracle
    assert {("llamacpp", 1, "layer_in"), ("hf", -1, "logits")} <= {(x["reference"], x["layer"], x["probe"])
                                                                   for x in judged}
    assert all(x["cmp_dtype"] == "float16" and x["nmse_cand_oracle"] == x["nmse_cand_oracle"] for x in judged)
    assert any("GGML_TYPE_F16" in n for n in r.notes)
    # the F32 cache it asked for is cast to F16 before the kernel: bit for bit the F16-cache run
    from harness.references.llamacpp import capture as llamacpp

    f32 = llamacpp.capture_for_case(r.request(), {"flash_attn": True, "type_k": "f32", "type_v": "f32"})
    f16 = llamacpp.capture_for_case(r.request(), {"flash_attn": True, "type_k": "f16", "type_v": "f16"})
    assert f32.probes.keys() == f16.probes.keys()
    assert all((f32.probes[k] == f16.probes[k]).all() for k in f32.probes)


@pytest.mark.llamacpp
def test_llamacpp_fa_q8_0_cache_needs_its_block(policy, need_llamacpp):
    rows = run(policy, family="gemma2", ref=HF_AND_LLAMACPP, candidate="llamacpp-fa-kv-q8_0")
    assert [r["status"] for r in rows] == ["skipped"]
    assert "block of 32 does not divide the head width 16" in rows[0]["reason"]


def test_a_candidate_that_fails_a_probe_is_never_excused_silently(policy):
    """The verdict rules hold unchanged for any candidate: a probe a layer must emit
    that the candidate neither returns nor declares is `missing` (a failure)."""
    import harness.candidates as api
    from harness.candidates.impl_body import ImplCandidate

    class Forgetful(ImplCandidate):
        def run_layer(self, call):
            out = super().run_layer(call)
            out.pop("attn_out")
            return out

    f = Forgetful()
    f.name = "forgetful"
    api._get.cache_clear()
    real = api._get
    try:
        api._get = lambda name: f if name == "forgetful" else real(name)
        rows = run(policy, family="llama", ref="hf", candidate="forgetful")
    finally:
        api._get = real
    st = _statuses(rows)
    assert st[("hf", 0, "attn_out")] == "missing" and st[("hf", 1, "attn_out")] == "missing"


# ---------------------------------------------------------------- reports name the candidate
def test_the_matrix_has_a_candidates_axis_and_the_views_show_it(policy, tmp_path):
    import pandas as pd

    from harness import views
    from harness.commands.diff import _only, compare
    from harness.matrix import parse_spec

    spec = parse_spec('families = ["llama"]\nvariants = "default"\nreferences = ["hf"]\ncandidates = ["impl", "hf-sdpa"]\n',
                      "inline")
    ids = [c.case_id() for c in spec.cases]
    assert len(ids) == 2 and "cand=" not in ids[0] and "/cand=hf-sdpa/" in ids[1]
    rows = [r for c in spec.cases for r in run(policy, **{k: v for k, v in c.to_dict().items()
                                                          if k in ("family", "ref", "candidate", "variant")})]
    df = pd.DataFrame(rows)
    cs = views.cases(df)
    assert list(cs["candidate"]) == ["impl", "hf-sdpa"] and set(cs["status"]) == {"pass"}
    md = views.summary_md(df, {"spec": {"name": "inline"}})
    assert "## Candidates × families" in md and "| hf-sdpa | ✅ pass" in md and "| impl | ✅ pass" in md
    page = views.report_html(df, {"spec": {"name": "inline"}})
    assert "data-candidate='hf-sdpa'" in page and "<h2>Candidates × families</h2>" in page
    # diff compares a candidate between two runs as it does impl: its worst error grew
    grown = df.copy()
    sel = (grown["candidate"] == "hf-sdpa") & (grown["probe"] == "attn_out") & (grown["layer"] == 1)
    grown.loc[sel, "nmse_cand_oracle"] = grown.loc[sel, "nmse_cand_oracle"] * 1e3
    res = compare(_only(df, "hf-sdpa", "base"), _only(grown, "hf-sdpa", "new"), 4.0)
    assert [g["case_id"] for g in res["grew"]] == [ids[1]] and res["grew"][0]["where"] == "L1 attn_out"
    assert not compare(_only(df, "impl", "base"), _only(grown, "impl", "new"), 4.0)["regressed"]
    with pytest.raises(UsageError, match="no case judging candidate 'llamacpp-fa'"):
        _only(df, "llamacpp-fa", "base")
