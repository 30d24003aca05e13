"""Bisecting a divergence: to a layer and a probe, to a feature, to a commit.

- ``first_divergence``: the FIRST failing comparison in dataflow order (layer,
  then probe in the order of the probe vocabulary), with its worst element and
  metrics, and the last comparison before it that still agreed.
- ``feature_bisect``: switch the case's features off -- in the reference config,
  so impl (which derives its layer configs from that config) loses them too --
  one at a time and in halves, and name the smallest set whose removal makes
  the case pass. A feature the family cannot switch off is listed as such.
- ``git_bisect``: ``git bisect run`` over the project's history with the case as
  the test, in a temporary worktree (the user's working tree is never touched),
  exit 125 for a commit that cannot run the case.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from impl.trace import LAYER_PROBES

FAILING = ("fail", "error")
_ORDER = {p: i for i, p in enumerate(LAYER_PROBES)}


def _key(r) -> tuple:
    layer = r["layer"] if r["layer"] is not None and r["layer"] >= 0 else -1
    probe = r["probe"]
    if layer == -1:  # model-level probes: embeddings before every layer, the rest after
        return (-1 if probe == "embeddings" else 10**6, 0)
    return (layer, -1 if probe == "*" else _ORDER.get(probe, 99))


def first_divergence(rows, candidate: str = "impl", reference: str | None = None) -> dict | None:
    """The first failing comparison of ``candidate`` (against ``reference``, or any)."""
    rows = [r for r in _records(rows) if r["candidate"] == candidate
            and (reference is None or r["reference"] == reference)]
    failing = [r for r in rows if r["status"] in FAILING]
    if not failing:
        return None
    first = min(failing, key=lambda r: (_key(r), r["reference"]))
    before = [r for r in rows if r["reference"] == first["reference"] and r["status"] == "pass"
              and _key(r) < _key(first)]
    last_ok = max(before, key=_key) if before else None
    return {
        "reference": first["reference"], "layer": first["layer"], "probe": first["probe"],
        "status": first["status"], "worst": first.get("worst", ""), "nmse": first.get("nmse"),
        "max_abs": first.get("max_abs"), "reason": first.get("reason", ""),
        "last_agreeing": None if last_ok is None else (last_ok["layer"], last_ok["probe"]),
    }


def describe(d: dict | None) -> str:
    if d is None:
        return "no divergence: every comparison passed"
    where = f"layer {d['layer']}" if d["layer"] is not None and d["layer"] >= 0 else "model level"
    lines = [f"first divergence vs {d['reference']}: {where}, probe {d['probe']} ({d['status']})"]
    if d.get("worst"):
        lines.append(f"  worst element: {d['worst']}  nmse={_g(d['nmse'])} max_abs={_g(d['max_abs'])}")
    if d.get("reason"):
        lines.append(f"  {d['reason']}")
    if d["last_agreeing"] is not None:
        layer, probe = d["last_agreeing"]
        lines.append(f"  last probe that still agreed: layer {layer}, {probe}")
    else:
        lines.append("  nothing before it agreed")
    return "\n".join(lines)


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _records(rows):
    if hasattr(rows, "to_dict"):
        return rows.to_dict("records")
    return list(rows)


# ----------------------------------------------------------------- features
def feature_bisect(case, policy, log=print) -> dict:
    """The smallest set of switchable features whose removal makes ``case`` pass."""
    from dataclasses import replace

    from . import families
    from .case import CaseRun

    fam = families.get(case.family)
    run = CaseRun(case, policy)
    switches = fam.feature_switches(run.config, set(run.features))
    unswitchable = sorted(set(run.features) & set(_decorations()) - set(switches) - {"kv_" + case.kv})
    runs = {"n": 0}

    def passes(off: frozenset) -> bool:
        overrides = dict(case.overrides)
        for tag in sorted(off):
            overrides.update(switches[tag])
        c = replace(case, overrides=tuple(sorted(overrides.items(), key=lambda kv: kv[0])))
        runs["n"] += 1
        rows = CaseRun(c, policy).rows()
        ok = not any(r["status"] in FAILING for r in rows if r["candidate"] == "impl")
        log(f"  features off {sorted(off) or '[]'}: {'pass' if ok else 'fail'}")
        return ok

    feats = sorted(switches)
    result = {"switchable": feats, "unswitchable": unswitchable, "smallest": None, "runs": 0}
    if passes(frozenset()):
        result["runs"] = runs["n"]
        result["note"] = "the case passes with every feature on"
        return result
    if not feats or not passes(frozenset(feats)):
        result["runs"] = runs["n"]
        result["note"] = ("switching off every switchable feature does not make the case pass; "
                          f"the cause is elsewhere (unswitchable features: {', '.join(unswitchable) or 'none'})")
        return result
    # shrink: drop halves, then single features, keeping "switched off => passes"
    off = list(feats)
    chunk = max(1, len(off) // 2)
    while chunk >= 1:
        i = 0
        while i < len(off) and len(off) > 1:
            trial = off[:i] + off[i + chunk:]
            if trial and passes(frozenset(trial)):
                off = trial
            else:
                i += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    result["smallest"] = off
    result["runs"] = runs["n"]
    return result


def _decorations():
    from .features import SPEC_DECORATIONS

    return SPEC_DECORATIONS


# ----------------------------------------------------------------- history
def git_bisect(good: str, bad: str, case_argv: list[str], repo: Path | None = None, log=print) -> dict:
    """Find the first commit between ``good`` and ``bad`` at which the case fails.

    Runs in a temporary ``git worktree`` of ``repo``; each step runs the case
    with THAT commit's code (its own harness/ and impl/ first on sys.path)."""
    repo = Path(repo or Path.cwd()).resolve()
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=repo, capture_output=True, text=True)
    if top.returncode != 0:
        raise RuntimeError(f"{repo} is not inside a git repository")
    repo = Path(top.stdout.strip())
    for rev in (good, bad):
        ok = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True)
        if ok.returncode != 0:
            raise RuntimeError(f"{rev!r} is not a commit of {repo}")
    with tempfile.TemporaryDirectory(prefix="conformance-bisect-") as tmp:
        wt = Path(tmp) / "wt"
        counter = Path(tmp) / "runs"
        _git(repo, "worktree", "add", "--detach", str(wt), bad)
        try:
            step = [sys.executable, "-m", "harness.bisect", "--step", str(counter), "--", *case_argv]
            _git(wt, "bisect", "start", bad, good)
            proc = subprocess.run(["git", "bisect", "run", *step], cwd=wt, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(wt), "PYTHONSAFEPATH": ""})
            out = proc.stdout + proc.stderr
            first = None
            for line in out.splitlines():
                if line.endswith("is the first bad commit"):
                    first = line.split()[0]
            subject = ""
            if first:
                subject = _git(repo, "log", "-1", "--format=%h %s", first).strip()
            _git(wt, "bisect", "reset")
        finally:
            _git(repo, "worktree", "remove", "--force", str(wt))
        runs = len(counter.read_text().splitlines()) if counter.exists() else 0
    if first is None:
        log(out[-2000:])
    return {"first_bad": first, "subject": subject, "runs": runs}


def _git(cwd: Path, *args) -> str:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {p.stderr.strip()[:300]}")
    return p.stdout


def _step(counter: str, argv: list[str]) -> int:
    """One ``git bisect run`` step: 0 the case passes, 1 it fails, 125 it cannot run here."""
    with open(counter, "a") as f:
        f.write("run\n")
    with tempfile.TemporaryDirectory(prefix="conformance-step-") as out:
        cmd = [sys.executable, "-c",
               "import sys; sys.path.insert(0, '.'); from harness.cli import main; sys.exit(main(sys.argv[1:]))",
               "run", *argv, "--out", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode == 0:
            return 0
        if p.returncode == 1 and (Path(out) / "rows.parquet").exists():
            return 1
        sys.stderr.write(f"cannot run the case at this commit (exit {p.returncode}): "
                         f"{shlex.join(cmd[3:])}\n{p.stderr[-500:]}\n")
        return 125


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--step" and sys.argv[3] == "--":
        sys.exit(_step(sys.argv[2], sys.argv[4:]))
    print("usage: python -m harness.bisect --step COUNTER -- RUN-ARGS...", file=sys.stderr)
    sys.exit(2)
