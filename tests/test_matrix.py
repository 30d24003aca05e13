"""The matrix runner: spec errors, coverage of the default spec, reports,
shards merged == unsharded, resume, honest exit statuses, the pytest plugin,
and an injected regression found by `conformance diff` under its feature."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent

TINY = """
name = "tiny"
families = ["llama", "qwen2"]
variants = "default"  # llama's plain form only (its wo_scale variant has its own tests)
kv_modes = ["decode", "paged"]

[[group]]
name = "hf"

[[group]]
name = "both"
families = ["llama"]
kv_modes = ["paged"]
references = ["all"]
"""


def spec(tmp_path, text: str, name="spec.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def one_line_exit_2(capsys, rc, *needles):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


BAD_SPECS = [
    ('kv_mode = ["paged"]', "unknown key 'kv_mode'; did you mean 'kv_modes'?"),
    ('[[group]]\nname = "g"\ndtype = ["float32"]', "[[group]] 'g': unknown key 'dtype'; did you mean 'dtypes'?"),
    ('kv_modes = ["pagd"]', "unknown kv mode 'pagd'; did you mean 'paged'?"),
    ('families = ["lama"]', "unknown family 'lama'; did you mean 'llama'?"),
    ('families = ["llama"]\noverrides = [{ num_kv_heads = 1 }]', "unknown config key 'num_kv_heads'"),
    ('tokens = [0]', "--tokens must be a positive integer"),
    ('seeds = ["one"]', "seeds takes non-negative integers"),
    ('backends = ["numpy"]\ndtypes = ["bfloat16"]', "backend numpy has no bfloat16"),
    ('families = ["llama"]\n[[exclude]]\nkv_modes = ["decode"]', "every exclusion needs a written reason"),
    ('[[exclude]]\nkv_mode = "decode"\nreason = "x"', "[[exclude]] #1: unknown key 'kv_mode'"),
    ('families = ["llama"]\nvariants = "default"\n[[exclude]]\nfamilies = ["llama"]\nreason = "all of it"',
     "expands to zero cases (1 excluded)"),
    ('families = [', "is not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD_SPECS, ids=[m for _, m in BAD_SPECS])
def test_a_bad_spec_is_one_line_naming_the_key_exit_2_no_report(text, message, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["matrix", spec(tmp_path, text), "--out", str(out), "-j1"])
    one_line_exit_2(capsys, rc, message)
    assert not out.exists()


def test_bad_command_line_is_one_line_exit_2(tmp_path, capsys):
    s = spec(tmp_path, 'families = ["llama"]\nvariants = "default"')
    one_line_exit_2(capsys, main(["matrix", s, "--shard", "3/2"]), "need 1 <= I <= N")
    one_line_exit_2(capsys, main(["matrix", s, "--shard", "2/5"]), "is empty: the spec has 1 cases")
    one_line_exit_2(capsys, main(["matrix", str(tmp_path / "nope.toml")]), "is not a file")
    one_line_exit_2(capsys, main(["matrix", "--resume", str(tmp_path)]), "is not a matrix run directory")
    one_line_exit_2(capsys, main(["merge", str(tmp_path)]), "is not a matrix run directory")
    one_line_exit_2(capsys, main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]), "is not a run directory")


def test_default_and_smoke_specs_cover_every_registered_family_and_variant():
    from harness import families
    from harness.matrix import load_spec

    for name in ("default", "smoke"):
        s = load_spec(ROOT / "fixtures" / "matrix" / f"{name}.toml")
        seen = {(c.family, c.variant) for c in s.cases}
        for fam_name, fam in families.registry().items():
            for variant in fam.variants or (None,):
                assert (fam_name, variant) in seen, f"{name}.toml does not run family {fam_name} variant {variant}"
    d = load_spec(ROOT / "fixtures" / "matrix" / "default.toml").cases
    assert {c.kv for c in d} == {"decode", "batched", "paged"}
    assert {(c.backend, c.dtype) for c in d} >= {("numpy", "float64"), ("numpy", "float32"), ("torch", "float32"),
                                                ("torch", "bfloat16")}
    assert {"all", "hf", "hf_cached", "llamacpp", "hf,mlx"} >= {c.ref for c in d} >= {"all", "hf", "hf_cached"} and len({c.seed for c in d}) >= 2 and len({c.tokens for c in d}) >= 2
    assert any(c.overrides for c in d)


def test_the_default_spec_builds_the_cases_issue_28_found_missing():
    """Ragged batches for every family (paged; batched on the representatives, every
    family in the breadth matrix), float16 (every family in the breadth matrix),
    realistic weights at float16 and bfloat16, and low-precision cases of 256 tokens
    or more."""
    from harness import families
    from harness.matrix import load_spec

    d = load_spec(ROOT / "fixtures" / "matrix" / "default.toml").cases
    b = load_spec(ROOT / "fixtures" / "matrix" / "breadth.toml").cases
    every = set(families.registry())
    ragged = {(c.family, c.kv) for c in d if c.ragged and (c.seqs or 0) >= 3}
    assert {f for f, kv in ragged if kv == "paged"} == every
    assert {f for f, kv in ragged if kv == "batched"} >= {"llama", "qwen3_next"}
    assert {(c.family, c.kv) for c in b if c.ragged and (c.seqs or 0) >= 3} == {
        (f, kv) for f in every for kv in ("batched", "paged")}
    low = [c for c in d if c.dtype in ("float16", "bfloat16")]
    assert {c.family for c in low if c.dtype == "bfloat16"} == every
    assert {c.family for c in b if c.dtype == "float16"} == every
    assert {c.dtype for c in low if c.weights == "realistic"} == {"float16", "bfloat16"}
    assert {c.dtype for c in low if c.tokens >= 256} == {"float16", "bfloat16"}


def test_shards_partition_the_cases_and_unshard_inverts():
    from harness.matrix import shard, unshard

    cases = list(range(11))
    parts = {i: shard(cases, i, 3) for i in (1, 2, 3)}
    assert sorted(x for p in parts.values() for x in p) == cases
    assert unshard(parts, 3) == cases


def _rows(d) -> pd.DataFrame:
    return pd.read_parquet(Path(d) / "rows.parquet")


def _require_llamacpp():
    from harness.references.llamacpp.capture import available

    if not available():
        if os.environ.get("CONFORMANCE_ALLOW_NO_LLAMACPP") == "1":
            pytest.skip("llama-cpp-python missing and CONFORMANCE_ALLOW_NO_LLAMACPP=1")
        pytest.fail("llama-cpp-python is not installed; opt out explicitly with CONFORMANCE_ALLOW_NO_LLAMACPP=1")


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory):
    """The tiny spec run once with two worker processes (the real parallel path)."""
    _require_llamacpp()
    tmp = tmp_path_factory.mktemp("matrix")
    s = spec(tmp, TINY)
    out = tmp / "full"
    assert main(["matrix", s, "--out", str(out), "-j2", "--plots", "all"]) == 0
    return s, out


def test_a_run_leaves_every_report(unsharded):
    _, d = unsharded
    # a finished run's journal is packed (issue 41: the largest file of a report)
    for f in ("rows.parquet", "rows.csv", "meta.json", "summary.md", "report.html", "junit.xml", "journal.jsonl.gz"):
        assert (d / f).is_file(), f
    df = _rows(d)
    assert len(pd.read_csv(d / "rows.csv")) == len(df)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["versions"]["git_commit"] is not None and meta["versions"]["torch"]
    assert meta["spec"]["name"] == "tiny" and len(meta["cases"]) == 5 and meta["wall_s"] > 0
    assert all("case_s" in meta["case_info"][c]["timings"] for c in meta["cases"])
    assert "llamacpp" in set(df["reference"]) and (df["candidate"] == "llamacpp").any()
    assert len(list((d / "plots").glob("*.png"))) == 5
    assert (d / "summary.md").read_text().startswith("# Conformance matrix `tiny`: PASS")
    suites = ET.parse(d / "junit.xml").getroot()
    assert sum(int(s.get("tests")) for s in suites) == 5


def test_plots_needed_draws_only_the_cases_a_reader_must_look_at(tmp_path, monkeypatch):
    """The default ``--plots needed``: a case whose rows all pass (or are not exposed)
    gets no PNG, one with a failing row or a finding does; ``all`` draws every case,
    ``none`` none (harness/matrix.py PLOT_WHICH: the plots were ~30% of the default
    matrix's cold time)."""
    import harness.case
    from harness import matrix
    from harness.case import Case

    statuses = {0: ["pass", "not-exposed"], 1: ["pass", "finding"], 2: ["pass", "fail"], 3: ["error"]}

    def fake_run_case(case, policy):
        rows = [dict(case_id=case.case_id(), candidate="impl", reference="hf", layer=0, probe="attn_out",
                     status=st, nmse=1e-9) for st in statuses[case.seed]]
        return rows, {"features": [], "timings": {}}

    monkeypatch.setattr(harness.case, "run_case", fake_run_case)
    drawn = []
    monkeypatch.setattr("harness.views.plot_case", lambda rows, path: drawn.append(rows[0]["case_id"]))
    for which, want in (("needed", [1, 2, 3]), ("all", [0, 1, 2, 3]), ("none", [])):
        drawn.clear()
        for seed in statuses:
            matrix.work(Case(family="llama", seed=seed).to_dict(), None, (str(tmp_path), which) if which != "none" else None)
        assert drawn == [Case(family="llama", seed=s).case_id() for s in want], which
    assert matrix.wants_plot([{"status": "pass"}], "needed") is False


def test_sharded_and_merged_equals_unsharded(unsharded, tmp_path):
    s, full = unsharded
    for i in (1, 2):
        assert main(["matrix", s, "--out", str(tmp_path / f"s{i}"), "-j1", "--shard", f"{i}/2", "--plots", "all"]) == 0
    assert len(_rows(tmp_path / "s1")) < len(_rows(full))
    assert main(["merge", str(tmp_path / "s2"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    pd.testing.assert_frame_equal(_rows(tmp_path / "m"), _rows(full))
    for view in ("summary.md", "report.html"):
        assert (tmp_path / "m" / view).read_text() == (full / view).read_text(), view
    assert sorted(p.name for p in (tmp_path / "m" / "plots").iterdir()) == sorted(p.name for p in (full / "plots").iterdir())
    # a shard missing is refused, not merged into a smaller report
    assert main(["merge", str(tmp_path / "s1"), "--out", str(tmp_path / "m2")]) == 2
    assert not (tmp_path / "m2").exists()


def test_resume_completes_an_interrupted_run_without_redoing_work(unsharded, tmp_path):
    _, full = unsharded
    d = tmp_path / "cut"
    d.mkdir()
    shutil.copy(full / "run.json", d)
    import gzip

    lines = gzip.decompress((full / "journal.jsonl.gz").read_bytes()).decode().splitlines(keepends=True)
    # two cases done, the third cut off mid-line by a kill
    (d / "journal.jsonl").write_text("".join(lines[:2]) + lines[2][:300])
    assert main(["matrix", "--resume", str(d), "-j1"]) == 0
    pd.testing.assert_frame_equal(_rows(d), _rows(full))
    assert json.loads((d / "meta.json").read_text())["cases_already_done"] == 2


def test_resume_after_a_real_kill_9(unsharded, tmp_path):
    """kill -9 of a real matrix process part-way (wherever it happens to be: inside a
    case, appending to the journal, writing a cached capture), then --resume: the
    finished run is the uninterrupted one, row for row."""
    import signal
    import subprocess
    import sys
    import time

    s, full = unsharded
    d = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "matrix", s, "--out", str(d), "-j1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = d / "journal.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (d / "rows.parquet").exists()  # nothing final was written before the end
    assert main(["matrix", "--resume", str(d), "-j1"]) == 0
    pd.testing.assert_frame_equal(_rows(d), _rows(full))
    assert json.loads((d / "meta.json").read_text())["cases_already_done"] >= 2
    assert not [p.name for p in d.rglob("*") if ".tmp" in p.name]


def test_features_map_lists_every_decoration(unsharded, capsys):
    from harness.features import SPEC_DECORATIONS

    _, d = unsharded
    assert main(["features", "--run", str(d)]) == 0
    out = capsys.readouterr().out
    words = [line.split() for line in out.splitlines() if line.strip()]
    assert set(SPEC_DECORATIONS) <= {w[0] for w in words}
    assert ["qkv_bias", "qwen2", "pass"] in [w[:3] for w in words]
    assert ["sinks", "-", "unverified:"] in [w[:3] for w in words]


def test_all_skipped_exits_non_zero(tmp_path, capsys):
    # mps never exists on Linux or in CI: every case is skipped, nothing compared
    s = spec(tmp_path, 'families = ["llama"]\nbackends = ["torch"]\ndevices = ["mps"]')
    assert main(["matrix", s, "--out", str(tmp_path / "r"), "-j1"]) == 1
    assert set(_rows(tmp_path / "r")["status"]) == {"skipped"}
    assert "No case compared anything" in (tmp_path / "r" / "summary.md").read_text()


REGRESSION = """
name = "regression"
families = ["llama", "qwen2"]
kv_modes = ["decode", "paged"]
"""


def test_an_injected_regression_shows_under_its_feature(tmp_path, capsys):
    from harness.mutants import applied, registry

    s = spec(tmp_path, REGRESSION)
    base, new = tmp_path / "base", tmp_path / "new"
    assert main(["matrix", s, "--out", str(base), "-j1", "--no-plots"]) == 0
    # -j1: in this process, where the mutant is applied
    with applied(registry()["qkv-bias-dropped"]):
        assert main(["matrix", s, "--out", str(new), "-j1", "--no-plots"]) == 1
    capsys.readouterr()
    assert main(["diff", str(base), str(base)]) == 0
    assert "no regression" in capsys.readouterr().out
    assert main(["diff", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    implicated = out.split("## Implicated feature")[1].split("##")[0]
    assert "`qkv_bias`: 2 of its 2 cases regressed" in implicated and "gqa" not in implicated
    assert "| qkv_bias | 2 | 2 |" in out


def test_error_growth_within_tolerance_is_a_regression(tmp_path, capsys):
    from harness.commands.diff import compare

    rows = pd.DataFrame([dict(case_id="c", family="llama", features="gqa;kv_decode", candidate="impl",
                              reference="hf", layer=0, probe="q", status="pass", reason="", nmse=1e-14,
                              tol_nmse=1e-10, err_ratio=1e-4)])
    grown = rows.assign(nmse=1e-12)
    res = compare(rows, grown, 4.0)
    assert [g["case_id"] for g in res["grew"]] == ["c"] and res["implicated"] == ["gqa", "kv_decode"]
    assert not compare(rows, rows.assign(nmse=3e-14), 4.0)["regressed"]


def test_pytest_plugin_runs_matrix_cases_as_items(tmp_path):
    # rms_norm_eps = 1: a whole number for a float field (HF's strict dataclass refuses the int;
    # issue 16 item 1 was a collection error here). PYTHONPATH: this checkout's plugin, not an installed one
    s = spec(tmp_path, 'families = ["llama", "qwen2"]\nvariants = "default"\nkv_modes = ["decode", "paged"]\n'
                       'overrides = [{ rms_norm_eps = 1 }]')
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--conformance-matrix", s,
                        "-k", "qwen2 and paged"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "spec.toml::qwen2/numpy-cpu-float32/paged/mixed/hf/s0/t16/rms_norm_eps=1 PASSED" in p.stdout
    assert "1 passed, 3 deselected" in p.stdout


def test_the_committed_baseline_is_a_passing_run_of_the_current_default_spec():
    """The baseline CI diffs against (.ci/run) is a run of THIS default spec in which every
    case passed and every case checked impl -- so a regression shows in the diff."""
    from harness.matrix import load_spec
    from harness.verdict import FAILING

    base = ROOT / "fixtures" / "baselines" / "default"
    meta = json.loads((base / "meta.json").read_text())
    spec = load_spec(ROOT / "fixtures" / "matrix" / "default.toml")
    assert meta["spec"]["name"] == "default" and meta["spec"]["sha"] == spec.sha, \
        "the baseline is not a run of the current default spec: regenerate it (fixtures/baselines/README.md)"
    rows = _rows(base)
    assert not set(rows["status"]) & set(FAILING)
    assert sorted(set(rows["case_id"])) == sorted(c.case_id() for c in spec.cases)
    impl_pass = rows[(rows["candidate"] == "impl") & (rows["status"] == "pass")]
    assert set(impl_pass["case_id"]) == set(rows["case_id"])  # no case passed on reference rows alone


def test_every_ci_workflow_parses_and_names_specs_that_load():
    """The workflows (.github/workflows/*.yml) must be YAML GitHub can read -- an unquoted
    ': ' inside a step name made long.yml unreadable, so the weekly job never ran -- and
    every matrix spec that they and .ci/run hand to `conformance` must exist and load."""
    import re

    import yaml

    from harness.matrix import load_spec

    texts = {".ci/run": (ROOT / ".ci" / "run").read_text()}
    for p in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        doc = yaml.safe_load(p.read_text())  # raises on what GitHub refuses
        assert isinstance(doc, dict) and doc.get("jobs"), p
        texts[str(p.relative_to(ROOT))] = p.read_text()
    named = {m for t in texts.values() for m in re.findall(r"fixtures/matrix/[\w.-]+\.toml", t)}
    assert "fixtures/matrix/smoke.toml" in named and "fixtures/matrix/long.toml" in named
    for spec in sorted(named):
        assert (ROOT / spec).is_file(), spec
        load_spec(str(ROOT / spec))
