"""``conformance upstream``: a release that moved a result is found, named, classified.

The end-to-end test plants releases: five "transformers" wheels built here from
the installed one (its own files, a version of their own), the fourth and fifth
with one line of ``LlamaAttention.forward`` changed (the query scaled by 1.001).
Bisected over a folder holding only them (``--find-links``), the command must
name the fourth as the first release that moved the result, say a divergence
appeared at ``q_rope``, show the planted line in the source hunks, and not run the
second release at all (bisection, not a sweep).
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from harness.cli import main
from harness.upstream.search import Bisector, Run, classify

RELEASES = ["5.24.0.post1", "5.24.0.post2", "5.24.0.post3", "5.24.0.post4", "5.24.0.post5"]
PLANTED = "5.24.0.post4"
MODELING = "transformers/models/llama/modeling_llama.py"
LINE = ("self.q_proj(hidden_states)", "(self.q_proj(hidden_states) * 1.001)")


# ---------------------------------------------------------------- the search, on its own
def _fake(first_changed: dict, releases: list[str], ran: list):
    """run_release for a Bisector: key k's value is 'new' from release first_changed[k] on."""
    def run_release(release, case_ids):
        ran.append(release)
        r = Run(release, set(case_ids))
        for k, first in first_changed.items():
            new = releases.index(release) >= releases.index(first)
            r.values[k] = ("fail" if new else "pass", "", -6 if new else -14)
        return r
    return run_release


def test_bisection_names_the_first_release_of_each_change_and_runs_few():
    rel = [f"1.{i}" for i in range(16)]
    keys = {("c/a", "impl", "hf", 0, "q"): "1.11", ("c/b", "impl", "hf", 1, "k"): "1.3"}
    ran: list = []
    b = Bisector(_fake(keys, rel, ran), ["c/a", "c/b"])
    got = {c.key: (c.release, c.previous, c.kind) for c in b.changes(rel, [rel[0], rel[-1]])}
    assert got == {k: (v, rel[rel.index(v) - 1], "divergence appeared") for k, v in keys.items()}
    assert len(set(ran)) <= 2 + 2 * 4, ran  # the ends, and log2(16) per change at most


def test_a_change_and_its_revert_inside_the_range_are_both_found_across_an_anchor():
    rel = [f"2.{i}" for i in range(8)]
    k = ("c/a", "impl", "hf", 0, "q")

    def run_release(release, case_ids):
        r = Run(release, set(case_ids))
        i = rel.index(release)
        r.values[k] = ("fail", "", -6) if 2 <= i < 5 else ("pass", "", -14)
        return r

    b = Bisector(run_release, ["c/a"])
    got = [(c.release, c.kind) for c in b.changes(rel, [rel[0], rel[3], rel[-1]])]
    assert got == [("2.2", "divergence appeared"), ("2.5", "divergence closed")]


@pytest.mark.parametrize("before,after,kind", [
    (("pass", "", -14), ("error", "x", None), "adapter broke"),
    (("pass", "", -14), ("refused", "x", None), "adapter broke"),
    (("pass", "", -14), ("absent", "", None), "adapter broke"),
    (("pass", "", -14), ("not-exposed", "why", None), "adapter broke"),
    (("error", "x", None), ("pass", "", -14), "adapter mended"),
    (("pass", "", -14), ("fail", "", -6), "divergence appeared"),
    (("pass", "", -14), ("finding", "", -6), "divergence appeared"),
    (("fail", "", -6), ("pass", "", -14), "divergence closed"),
    (("fail", "", -6), ("finding", "", -6), "divergence changed"),
    (("pass", "", -30), ("pass", "", -14), "drift inside the tolerance"),
])
def test_each_kind_of_change(before, after, kind):
    assert classify(before, after) == kind


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv,says", [
    (["upstream", "numpy", "1..2"], "unknown reference package 'numpy'"),
    (["upstream", "transformers", "5.24.0"], "is not A..B"),
    (["upstream", "transformers", "5.24.0.post1..5.24.0.post9"], "5.24.0.post9 is not a release"),
    (["upstream", "transformers", "5.24.0.post3..5.24.0.post1"], "runs backwards"),
    (["upstream", "transformers", "5.24.0.post1..5.24.0.post2", "--family", "nosuch"], "unknown family 'nosuch'"),
    (["upstream", "transformers", "5.24.0.post1..5.24.0.post2", "--harness", "no-such-rev"], "is not a commit"),
])
def test_bad_input_is_one_line_and_leaves_nothing(argv, says, tmp_path, capsys, planted):
    out = tmp_path / "out"
    rc = main([*argv, "--find-links", str(planted), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not out.exists()


# ---------------------------------------------------------------- planted releases
@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Five transformers wheels from the installed release's own files (one zip of them,
    copied per release), each with its version; the PLANTED one and the next with the
    query scaled in LlamaAttention.forward."""
    d = tmp_path_factory.mktemp("releases")
    dist = metadata.distribution("transformers")
    root = Path(dist.locate_file(""))
    common = d / "common.zip"
    with zipfile.ZipFile(common, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in (root / "transformers").rglob("*"):
            rel = f.relative_to(root).as_posix()
            if f.is_file() and "__pycache__" not in f.parts and rel != MODELING:
                z.write(f, rel)
    src = (root / MODELING).read_text()
    assert src.count(LINE[0]) == 1, "the planted line is not in this release's modeling_llama.py"
    meta = dist.read_text("METADATA")
    for v in RELEASES:
        w = d / f"transformers-{v}-py3-none-any.whl"
        shutil.copy(common, w)
        body = src.replace(*LINE) if v >= PLANTED else src
        di = f"transformers-{v}.dist-info"
        with zipfile.ZipFile(w, "a", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            z.writestr(MODELING, body)
            z.writestr(f"{di}/METADATA", re.sub(r"(?m)^Version: .*$", f"Version: {v}", meta))
            z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests/test_upstream.py\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{di}/RECORD", "")
    common.unlink()
    return d


def test_the_bisection_finds_a_planted_release(planted, tmp_path, capsys):
    spec = tmp_path / "one.toml"
    spec.write_text(textwrap.dedent("""
        [[group]]
        name = "one"
        families = ["llama"]
        variants = "default"
        references = ["hf"]
        kv_modes = ["decode"]
    """))
    out = tmp_path / "up"
    rc = main(["upstream", "transformers", f"{RELEASES[0]}..{RELEASES[-1]}", "--find-links", str(planted),
               "--spec", str(spec), "--out", str(out), "-j", "1", "-q"])
    cap = capsys.readouterr()
    text = cap.out
    assert rc == 1, cap  # a release changed a verdict
    assert f"first in {PLANTED}" in text, text
    changes = json.loads((out / "changes.json").read_text())
    assert changes and {c["release"] for c in changes} == {PLANTED}
    # the q probe is q_proj's output (a module hook): the scaled query shows from q_rope on
    q = [c for c in changes if c["probe"] == "q_rope" and c["candidate"] == "impl"]
    assert not [c for c in changes if c["probe"] in ("q", "k", "v", "attn_in")]
    assert q and q[0]["kind"] == "divergence appeared" and q[0]["previous"] == RELEASES[2], q
    report = (out / "report.md").read_text()
    assert f"## transformers {PLANTED} (from {RELEASES[2]})" in report
    assert f"+{' ' * 8}query_states = {LINE[1]}" in report.replace("\\|", "|") or LINE[1] in report
    # bisection, not a sweep: the second release was never needed
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert f"transformers-{RELEASES[1]}" not in runs and f"transformers-{PLANTED}" in runs, runs
