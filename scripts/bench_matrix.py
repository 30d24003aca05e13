#!/usr/bin/env python
"""How long the matrix takes: cold (empty capture cache), warm (every reference
capture cached, only impl recomputed), and how warm wall time grows with the
number of cases (the shards 1/4 and 1/2 of the same spec, then all of it).

    .venv/bin/python scripts/bench_matrix.py [SPEC] [-j 2] [--check]

Budget for the default matrix on a 2-core machine with -j2: cold under 300 s,
warm under 60 s (installs excluded). --check exits 1 when over budget. The
load average is printed with the numbers: other work on the machine makes
every number here larger.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLD_BUDGET_S, WARM_BUDGET_S = 300.0, 60.0


def matrix(spec: str, out: Path, jobs: int, cache: Path, *extra: str) -> tuple[float, int, int]:
    """Run the matrix; ``(wall seconds, cases, exit status)``."""
    env = dict(os.environ, CONFORMANCE_CACHE=str(cache))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "harness.cli", "matrix", spec, "--out", str(out), "-j", str(jobs), *extra],
                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = time.perf_counter() - t
    if p.returncode == 2:
        sys.exit(f"bench: the matrix refused its input:\n{p.stdout}")
    import json

    cases = len(json.loads((out / "run.json").read_text())["cases"])
    return wall, cases, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "fixtures" / "matrix" / "default.toml"))
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="exit 1 when cold or warm is over budget")
    a = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        cold, n, rc = matrix(a.spec, tmp / "cold", a.jobs, cache)
        print(f"cases: {n} (spec {a.spec}, -j{a.jobs}, {os.cpu_count()} CPUs; matrix exit status {rc})", flush=True)
        print(f"cold (empty cache): {cold:7.1f} s  ({cold / n:.2f} s/case)  budget {COLD_BUDGET_S:.0f} s", flush=True)
        warm, _, _ = matrix(a.spec, tmp / "warm", a.jobs, cache)
        print(f"warm (cached):      {warm:7.1f} s  ({warm / n:.2f} s/case)  budget {WARM_BUDGET_S:.0f} s", flush=True)
        points = [(n, warm)]
        for k in (4, 2):
            w, m, _ = matrix(a.spec, tmp / f"warm-1of{k}", a.jobs, cache, "--shard", f"1/{k}")
            points.append((m, w))
        points.sort()
        print("warm wall time against cases:")
        for m, w in points:
            print(f"  {m:5d} cases  {w:7.1f} s")
        # least squares: wall = fixed + per_case * cases
        mx = sum(m for m, _ in points) / len(points)
        my = sum(w for _, w in points) / len(points)
        slope = sum((m - mx) * (w - my) for m, w in points) / max(sum((m - mx) ** 2 for m, _ in points), 1e-9)
        print(f"  fit: {my - slope * mx:.1f} s fixed (imports, worker start, spec check, reports) "
              f"+ {slope:.3f} s per case -> {(WARM_BUDGET_S - (my - slope * mx)) / max(slope, 1e-9):.0f} cases "
              f"fit the warm budget")
    load1 = os.getloadavg()
    print(f"load average (1 min) before {load0[0]:.1f}, after {load1[0]:.1f}")
    over = cold > COLD_BUDGET_S or warm > WARM_BUDGET_S
    print("over budget" if over else "within budget")
    return 1 if over and a.check else 0


if __name__ == "__main__":
    sys.exit(main())
