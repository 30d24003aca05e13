"""Bisection: to the first divergent probe, to a feature, to a commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import run
from harness.bisect import describe, first_divergence, git_bisect
from harness.mutants import applied, registry

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(registry()))
def test_bisect_names_the_layer_and_probe_where_each_mutant_acts(policy, name):
    m = registry()[name]
    kw = dict(m.case)
    kw.setdefault("ref", "hf")
    with applied(m):
        rows = run(policy, **kw)
    d = first_divergence(rows)
    assert d is not None
    assert d["probe"] == m.first_probe
    if m.layer is not None:
        assert d["layer"] == m.layer
    text = describe(d)
    assert f"probe {m.first_probe}" in text and "worst element" in text or d["status"] == "error"


def test_bisect_command_prints_the_first_divergence(capsys):
    from harness.cli import main

    with applied(registry()["scale-squared"]):
        rc = main(["bisect", "--family", "llama", "--ref", "hf"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "first divergence vs hf: layer 0, probe attn_probs" in out
    assert "last probe that still agreed: layer 0, k_rope" in out


def test_bisect_on_a_passing_case_says_so(capsys):
    from harness.cli import main

    assert main(["bisect", "--family", "qwen3"]) == 0
    assert "no divergence" in capsys.readouterr().out


def _sh(cwd, *args):
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_git_bisect_finds_a_planted_bad_commit(tmp_path):
    """A scratch history of 12 commits with one planted bug: found in <= log2(12)+1 runs."""
    scratch = tmp_path / "scratch"
    _sh(tmp_path, "git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(scratch))
    _sh(scratch, "git", "config", "user.email", "t@example.com")
    _sh(scratch, "git", "config", "user.name", "t")
    good = _sh(scratch, "git", "rev-parse", "HEAD")
    m = registry()["scale-squared"]
    planted = None
    for i in range(12):
        (scratch / "NOTES.txt").write_text(f"step {i}\n")
        if i == 7:
            cfg = scratch / "impl" / "config.py"
            cfg.write_text(cfg.read_text().replace(m.old, m.new))
        _sh(scratch, "git", "add", "-A")
        _sh(scratch, "git", "commit", "--quiet", "-m", f"step {i}" + (" (planted)" if i == 7 else ""))
        if i == 7:
            planted = _sh(scratch, "git", "rev-parse", "HEAD")
    bad = _sh(scratch, "git", "rev-parse", "HEAD")
    before = _sh(scratch, "git", "status", "--porcelain")
    res = git_bisect(good, bad, ["--family", "llama", "--ref", "hf", "--tokens", "8"], repo=scratch)
    assert res["first_bad"] and planted.startswith(res["first_bad"])
    import math

    assert res["runs"] <= math.floor(math.log2(12)) + 1
    # the user's working tree is untouched and no bisect is left running
    assert _sh(scratch, "git", "status", "--porcelain") == before
    assert _sh(scratch, "git", "rev-parse", "HEAD") == bad
    assert "worktree" not in _sh(scratch, "git", "worktree", "list").split("\n", 1)[-1]
