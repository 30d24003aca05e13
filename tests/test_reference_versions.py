"""A run names the references' versions, and says when they are not the lock's.

Every report's header (summary.md, report.html) names transformers' and
llama-cpp-python's versions and says plainly when a run was made on others than
the calibrated ones (lock.txt); `conformance diff` says first when two runs'
versions differ and marks what changed as "versions changed", apart from a
regression on the same versions.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from harness.cli import main
from harness.versions import calibrated


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "r"
    assert main(["run", "--family", "llama", "--ref", "hf", "--out", str(d), "-q", "--no-plots"]) == 0
    return d


def _rewrite(src, dst, transformers: str | None = None, fail: bool = False):
    shutil.copytree(src, dst)
    meta = json.loads((dst / "meta.json").read_text())
    if transformers:
        meta["versions"]["transformers"] = transformers
        meta["calibration"]["drift"] = [["transformers", transformers, calibrated()["transformers"]]]
    (dst / "meta.json").write_text(json.dumps(meta))
    if fail:
        df = pd.read_parquet(dst / "rows.parquet")
        i = df.index[(df["probe"] == "q") & (df["layer"] == 0)][0]
        df.loc[i, "status"] = "fail"
        df.to_parquet(dst / "rows.parquet", index=False)
        df.to_csv(dst / "rows.csv", index=False)
    from harness import views

    views.write_all(dst, pd.read_parquet(dst / "rows.parquet"), json.loads((dst / "meta.json").read_text()))
    return dst


def test_a_run_on_the_lock_says_so_in_its_header(one_run):
    md = (one_run / "summary.md").read_text()
    v = calibrated()
    assert f"references: transformers {v['transformers']}, llama-cpp-python {v['llama_cpp_python']}" in md
    assert "the calibrated versions (lock.txt)" in md and "NOT" not in md.split("\n\n")[1]
    assert "id='versions' class='calibrated'" in (one_run / "report.html").read_text()


def test_a_run_on_another_release_says_so_in_its_header(one_run, tmp_path):
    d = _rewrite(one_run, tmp_path / "other", transformers="99.1.0")
    md = (d / "summary.md").read_text()
    head = md.split("\n\n")[1]
    assert head.startswith("**Warning:** references: transformers 99.1.0")
    assert f"NOT the calibrated versions: transformers 99.1.0 (calibrated: {calibrated()['transformers']})" in head
    html = (d / "report.html").read_text()
    assert "id='versions' class='uncalibrated'" in html and "NOT the calibrated versions" in html


def test_diff_says_the_versions_changed_before_it_says_regression(one_run, tmp_path, capsys):
    same = _rewrite(one_run, tmp_path / "same", fail=True)
    moved = _rewrite(one_run, tmp_path / "moved", transformers="99.1.0", fail=True)
    assert main(["diff", str(one_run), str(same)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("# Conformance diff: REGRESSION") and "Versions changed" not in out
    assert main(["diff", str(one_run), str(moved)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("# Conformance diff: CHANGED WITH THE VERSIONS")
    assert "**Versions changed between the runs: transformers " in out and "→ 99.1.0" in out
    assert "## New failures (versions changed)" in out


def test_an_engine_package_in_one_run_only_is_no_version_change(tmp_path):
    """A baseline written where the `engines` extra was installed, diffed against a run
    without it: the engines shape only a candidate that runs on them, so nothing changed;
    two releases of one, or of a reference, did."""
    from harness.commands.diff import version_changes

    def run_dir(name, **versions):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"versions": {"transformers": "5.24.0", **versions}}))
        return str(d)

    base = run_dir("base", onnxruntime="1.31.1", openvino="2026.4.1")
    assert version_changes(base, run_dir("plain", onnxruntime=None, openvino=None)) == []
    assert version_changes(base, run_dir("newer", onnxruntime="1.32.0", openvino=None)) == \
        [("onnxruntime", "1.31.1", "1.32.0")]
    assert version_changes(base, run_dir("tf", transformers="5.25.0", onnxruntime=None, openvino=None)) == \
        [("transformers", "5.24.0", "5.25.0")]
