"""Measure the oracle-ratio rule (fixtures/tolerance.toml ``ratio``; judge.py
``judge_against_oracle``): for every row a candidate is judged through the
float64 oracle, the ratio of the candidate's NMSE to the oracle over the
reference's own -- the number the rule's 4x must sit above for a correct
candidate and below for a bug.

    PYTHONPATH=$PWD python scripts/oracle_ratio.py fixtures/matrix/oracle_ratio.toml [-j 2]
    PYTHONPATH=$PWD python scripts/oracle_ratio.py SPEC --mutant attn-v-accumulated-in-input-dtype

Per slice (dtype, weights, tokens): the worst ratio over the rows where the
ratio decides (``ratio x ref`` above the slice's ``nmse_floor``: below it the
floor does, and a ratio there says nothing of the rule), the row it was at, and
the worst ratio over all rows. With ``--mutant`` the cases run in this process
with that mutant applied (harness/mutants ``applied``), so a bug's ratio is
measured on the same cases as the clean one's.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="a matrix spec (fixtures/matrix/oracle_ratio.toml)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (1 with --mutant)")
    p.add_argument("--mutant", help="apply this mutant (harness/kinds/*/mutants) to every case")
    p.add_argument("--only", metavar="TEXT", help="only the cases whose id contains TEXT (e.g. t256)")
    a = p.parse_args(argv)

    from contextlib import nullcontext

    from harness import matrix
    from harness.errors import UsageError
    from harness.mutants import applied, registry
    from harness.policy import load_policy

    try:
        spec = matrix.load_spec(a.spec)
        cases = [c for c in matrix.run_order(matrix.nonempty(spec)) if not a.only or a.only in c.case_id()]
        if not cases:
            raise UsageError(f"no case of {a.spec} has {a.only!r} in its id")
        if a.mutant and a.mutant not in registry():
            raise UsageError(f"unknown mutant {a.mutant!r}; see `conformance mutate --help` for the registry")
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    policy = load_policy(None)
    worst: dict[tuple, dict] = defaultdict(lambda: {"decides": 0.0, "at": "", "all": 0.0, "rows": 0, "cases": set()})

    def done(c, rec):
        for r in rec["rows"]:
            cand, ref = r.get("nmse_cand_oracle"), r.get("nmse_ref_oracle")
            if r.get("candidate") != "impl" or cand is None or ref is None or not ref > 0:
                continue
            tol, _ = policy.tolerance(r["cmp_dtype"], "default")
            key = (r["cmp_dtype"], c.weights, c.tokens)
            w, x = worst[key], cand / ref
            if not math.isfinite(x):  # a NaN / inf candidate (an overflow) is the worst ratio, never skipped
                x = math.inf
            w["rows"] += 1
            w["cases"].add(c.case_id())
            w["all"] = max(w["all"], x)
            if tol["ratio"] * ref > tol["nmse_floor"] and x > w["decides"]:
                w["decides"], w["at"] = x, f"{c.family} L{r['layer']}.{r['probe']} ({r['status']})"
        print(f"done {c.case_id()}", file=sys.stderr, flush=True)

    jobs = 1 if a.mutant else a.jobs
    with (applied(registry()[a.mutant]) if a.mutant else nullcontext()):
        matrix.execute(cases, jobs, None, None, lambda c: None, done)
    print("| dtype | weights | tokens | cases | rows | worst ratio where it decides | at | worst ratio, any row |")
    print("|---|---|---|---|---|---|---|---|")
    for (dt, wt, n), w in sorted(worst.items()):
        print(f"| {dt} | {wt} | {n} | {len(w['cases'])} | {w['rows']} | {w['decides']:.2f} | {w['at']} | "
              f"{w['all']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
