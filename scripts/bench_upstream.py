#!/usr/bin/env python
"""What a `conformance upstream` bisection costs (issue 36: "bisecting transformers
5.20.0..5.25.0 on one family's default cases takes <= 5 minutes", cached
environments).

    .venv/bin/python scripts/bench_upstream.py [--package transformers] [--range 5.20.0..5.25.0]
        [--family mamba] [--envs DIR] [--check] [--json FILE]

Three runs of the same command, each in a fresh process:

1. ``cold``: no release environment, an empty capture cache (the first bisection on a
   machine: every release installed, every capture made);
2. ``envs cached``: the environments kept (``CONFORMANCE_ENVS``), the capture cache
   empty again -- the goal's condition: the releases are installed, the numbers are not;
3. ``warm``: both kept (a second look at the same range).

``--check`` exits 1 when (2) is over 300 s. The wall, the load average and the releases
each run made are printed; llama-cpp-python's releases are source builds (about 5
minutes each on 2 cores, the wheel kept per release): ``--package llama-cpp-python``
measures that instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 300.0


def once(label: str, args: list[str], env: dict, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "harness", "upstream", *args, "--out", str(out), "-q"],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    last = (r.stdout.strip().splitlines() or [""])[-1]
    runs = ""
    rep = out / "report.md"
    if rep.is_file():
        runs = next((ln for ln in rep.read_text().splitlines() if ln.startswith("- runs made:")), "")
    print(f"{label:13s} {wall:7.1f} s wall (load {load:.1f} at start), exit {r.returncode}: {last}")
    if runs:
        print(f"{'':13s} {runs[2:]}")
    if r.returncode not in (0, 1):
        print(r.stderr[-2000:], file=sys.stderr)
    return {"label": label, "wall_s": round(wall, 1), "load": round(load, 2), "exit": r.returncode, "last": last,
            "runs": runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", default="transformers")
    p.add_argument("--range", default="5.20.0..5.25.0")
    p.add_argument("--family", default="mamba")
    p.add_argument("--envs", help="keep the release environments here (default: a temporary folder)")
    p.add_argument("--skip-cold", action="store_true", help="the environments are already made: runs 2 and 3 only")
    p.add_argument("--check", action="store_true", help=f"exit 1 when the envs-cached run is over {GOAL_S:.0f} s")
    p.add_argument("--json", help="write the numbers here")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-upstream-"))
    envs = Path(a.envs) if a.envs else tmp / "envs"
    args = [a.package, a.range, "--family", a.family]
    base = dict(os.environ, CONFORMANCE_ENVS=str(envs))
    print(f"conformance upstream {' '.join(args)} (environments: {envs})")
    results = []
    if not a.skip_cold:
        results.append(once("cold", args, dict(base, CONFORMANCE_CACHE=str(tmp / "cache-cold")), tmp / "out"))
    results.append(once("envs cached", args, dict(base, CONFORMANCE_CACHE=str(tmp / "cache-2")), tmp / "out"))
    results.append(once("warm", args, dict(base, CONFORMANCE_CACHE=str(tmp / "cache-2")), tmp / "out"))
    goal = next(r for r in results if r["label"] == "envs cached")
    ok = goal["wall_s"] <= GOAL_S and goal["exit"] in (0, 1)
    print(f"goal: envs cached <= {GOAL_S:.0f} s: {'ok' if ok else 'MISSED'} ({goal['wall_s']} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": args, "results": results, "goal_s": GOAL_S, "ok": ok}, indent=1))
    if not a.envs:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if a.check and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
