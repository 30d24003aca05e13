"""``conformance fuzz``: generated cases until the budget ends, each failure
shrunk to the smallest config that still fails (harness/fuzz.py).

- three-way examples (impl, HF, llama.cpp) over each family's config space,
  restricted to what its references can express; a failure prints the exact
  ``conformance run ...`` that reproduces it and is appended as a ``[[group]]``
  to ``fixtures/matrix/fuzz_regressions.toml``, so the matrix runs it from then
  on (``.ci/run`` runs that spec);
- spec examples: one layer outside what any reference can say, impl against the
  spec's own float64 formulas (harness/specref.py), labelled ``spec``; a failure
  is appended to ``fixtures/matrix/fuzz_spec_regressions.jsonl``, which
  tests/test_fuzz.py replays.

The report (stdout, and ``fuzz.json`` / ``fuzz.md`` in the run directory):
examples per kind, throughput (cases per minute), and the feature pairs
exercised together (of every pair of the spec's decorations).

Exit status: 0 no failure, 1 a failure (each shrunk and recorded), 2 bad input.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from pathlib import Path

from ..errors import UsageError, suggest
from ..cli import add_verbose
from .. import families, fuzz, report
from ..references import choices
from ..policy import load_policy
from ..cache import cache_dir
from .. import runlog

ROOT = Path(__file__).resolve().parents[2]
REGRESSIONS = ROOT / "fixtures" / "matrix" / "fuzz_regressions.toml"
SPEC_REGRESSIONS = ROOT / "fixtures" / "matrix" / "fuzz_spec_regressions.jsonl"
_HEADER = """# Regression cases found by `conformance fuzz` (harness/fuzz.py), each the
# smallest config hypothesis shrank a failure to, with the exact command that
# reproduces it. The matrix runs them (.ci/run): once fixed -- or written down
# as a bounded finding in fixtures/tolerance.toml -- each must pass.
name = "fuzz-regressions"
description = "shrunk failures of conformance fuzz, one group each"
"""


def register(sub) -> None:
    p = sub.add_parser("fuzz", help="generated three-way cases until the budget ends; failures shrunk, "
                                    "reproduced and written as regression cases")
    p.add_argument("--family", action="append", metavar="F", help="only these families (repeatable or F,G)")
    p.add_argument("--budget", default="10m", help="wall time: 90s, 10m, 1h (default 10m)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    p.add_argument("--ref", default="all", help="hf, llamacpp or all (default all: three-way)")
    p.add_argument("--spec-share", type=float, default=0.2, metavar="F",
                   help="share of the budget for spec examples, impl against the spec's formulas (default 0.2)")
    p.add_argument("--out", metavar="DIR", help="run directory (default reports/<run-id>)")

    add_verbose(p)  # transformers' and hypothesis' own chatter to <out>/log.txt (stderr with -v)
    p.add_argument("--policy", metavar="TOML", help="tolerance policy (default fixtures/tolerance.toml)")
    p.add_argument("--no-record", dest="record", action="store_false",
                   help="do not append shrunk failures to the regression files")
    p.add_argument("--replay-spec", metavar="JSON", help="run one spec example (as a failure prints it) and exit")
    p.set_defaults(fn=cmd_fuzz)


def parse_budget(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--budget {text!r} is not a duration; valid: a positive number with s, m or h (90s, 10m)")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def _families(requested) -> list[str]:
    # every family with a fuzz space of its own (harness/families/<name>: fuzz_space)
    known = [n for n, f in families.registry().items() if getattr(f, "fuzz_space", None) is not None]
    if not requested:
        return known
    names = [n.strip() for item in requested for n in item.split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise UsageError(f"unknown family {n!r} for --family; {suggest(n, known)}")
    return names


def cmd_fuzz(a) -> int:
    if a.replay_spec:
        try:
            ex = fuzz.spec_from_dict(json.loads(a.replay_spec))
        except (ValueError, TypeError, KeyError) as e:
            raise UsageError(f"--replay-spec is not a spec example as fuzz prints it: {e}") from None
        out = fuzz.run_spec(ex)
        print(f"{'FAIL' if out.failed else 'pass'} {out.label}" + (f": {out.why}" if out.failed else ""))
        return 1 if out.failed else 0
    budget = parse_budget(a.budget)
    if a.ref not in choices():
        raise UsageError(f"unknown reference {a.ref!r}; {suggest(a.ref, choices())}")
    if not 0.0 <= a.spec_share <= 1.0:
        raise UsageError(f"--spec-share must be between 0 and 1, got {a.spec_share}")
    fams = _families(a.family)
    try:
        import hypothesis  # noqa: F401 -- an optional extra ([dev]): refused in one line where missing
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:
        raise UsageError("conformance fuzz needs hypothesis: pip install -e '.[dev]'") from None
    policy = load_policy(a.policy)
    run_id = report.new_run_id()
    d = report.check_out(a.out, run_id)  # a bad --out is refused before the budget is spent

    # hypothesis keeps its own files (the constants it collects) in the cache, not in a
    # .hypothesis/ of whatever folder the user ran the command from (issue 41)
    set_hypothesis_home_dir(str(cache_dir() / "hypothesis"))

    db = cache_dir() / "fuzz-db"
    stats = fuzz.HuntStats()
    t0 = time.monotonic()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    spec_budget = budget * a.spec_share
    if spec_budget > 0:
        log(f"spec examples (impl against the spec's formulas), {spec_budget:.0f}s:")
        fuzz.hunt("spec", fuzz.spec_strategy(), fuzz.run_spec, spec_budget, a.seed, stats, db,
                  shrink_s=min(60.0, spec_budget), log=log)
    rest = budget - (time.monotonic() - t0)
    if rest > 0 and fams:
        log(f"three-way examples over {len(fams)} families (ref {a.ref}), {rest:.0f}s:")
        # every family its share of the time, in a seeded order: hypothesis explores around
        # what it found, and one strategy over all families spends a short budget on a few
        order = list(fams)
        random.Random(a.seed).shuffle(order)
        for i, fam in enumerate(order):
            share = (budget - (time.monotonic() - t0)) / (len(order) - i)
            if share <= 0:
                break
            fuzz.hunt("three-way", fuzz.case_strategy([fam], a.ref), lambda c: fuzz.run_three_way(c, policy),
                      share, a.seed, stats, db, shrink_s=max(60.0, share), log=log)
    wall = time.monotonic() - t0
    res = summarize(stats, wall, budget, a, fams)
    recorded = record(stats, res) if a.record else []
    d.mkdir(parents=True, exist_ok=True)

    runlog.attach(d / runlog.LOG_NAME)
    (d / "fuzz.json").write_text(json.dumps(res, indent=1, default=str))
    text = markdown(res, recorded)
    (d / "fuzz.md").write_text(text)
    print(text.split("\n<details>")[0])  # the pair list is in fuzz.md
    print(f"report: {d}")
    n_fail = len(res["failures"]) if isinstance(res["failures"], (list, dict)) else int(res["failures"])
    print(f"{'FAIL' if n_fail else 'PASS'}: {n_fail} failing generated case{'s' * (n_fail != 1)} "
          f"in {res.get('wall_s', wall):.0f} s")
    return 1 if res["failures"] else 0


def summarize(stats, wall: float, budget: float, a, fams) -> dict:
    per_min = {k: (n / (stats.seconds_by_kind.get(k, 0.0) / 60) if stats.seconds_by_kind.get(k) else 0.0)
               for k, n in stats.by_kind.items()}
    failures = []
    for out, ex in stats.failures:
        item = {"kind": out.kind, "label": out.label, "why": out.why}
        if out.kind == "spec":
            item["reproduce"] = fuzz.spec_repro(ex)
            item["example"] = fuzz.spec_to_dict(ex)
        else:
            item["reproduce"] = fuzz.repro_command(ex)
            item["case"] = ex.to_dict()
        failures.append(item)
    return {"budget_s": budget, "wall_s": round(wall, 1), "seed": a.seed, "ref": a.ref, "families": fams,
            "examples": stats.examples, "by_kind": stats.by_kind, "refused_draws": stats.refused,
            "shrink_runs": stats.shrink_runs,
            "cases_per_min_wall": round(stats.examples / (wall / 60), 2) if wall else 0.0,
            "cases_per_min_by_kind": {k: round(v, 2) for k, v in per_min.items()},
            "pairs": sorted("+".join(p) for p in stats.pairs), "pairs_total": fuzz.all_pairs(),
            "pairs_by_kind": {k: len(v) for k, v in stats.pairs_by_kind.items()},
            "three_way_by_family": dict(sorted(stats.by_family.items())),
            "three_way_pairs": sorted("+".join(p) for p in stats.pairs_by_kind.get("three-way", ())),
            "failures": failures}


def record(stats, res) -> list[str]:
    """Append every shrunk failure to the regression files (once per case)."""
    done = []
    three = [(o, ex) for o, ex in stats.failures if o.kind == "three-way"]
    if three:
        text = REGRESSIONS.read_text() if REGRESSIONS.exists() else _HEADER
        n = text.count("[[group]]")
        for out, case in three:
            if f"reproduce: {fuzz.repro_command(case)}\n" in text:
                continue
            n += 1
            text += "\n" + fuzz.regression_group(case, out.why, n)
            done.append(str(REGRESSIONS))
        REGRESSIONS.write_text(text)
    spec = [(o, ex) for o, ex in stats.failures if o.kind == "spec"]
    if spec:
        have = SPEC_REGRESSIONS.read_text().splitlines() if SPEC_REGRESSIONS.exists() else []
        for out, ex in spec:
            line = json.dumps({"why": out.why, "example": fuzz.spec_to_dict(ex)}, sort_keys=True)
            if line not in have:
                have.append(line)
                done.append(str(SPEC_REGRESSIONS))
        SPEC_REGRESSIONS.write_text("\n".join(have) + "\n")
    return sorted(set(done))


def markdown(res: dict, recorded: list[str]) -> str:
    lines = [f"# conformance fuzz: {len(res['failures'])} failure(s)", "",
             f"- budget {res['budget_s']:.0f}s, wall {res['wall_s']:.0f}s, seed {res['seed']}, ref {res['ref']}, "
             f"{len(res['families'])} families",
             f"- examples: {res['examples']} ({', '.join(f'{k} {v}' for k, v in res['by_kind'].items()) or 'none'}); "
             f"{res['refused_draws']} draws refused by the families' config validation; "
             f"{res['shrink_runs']} shrink runs",
             f"- throughput: {res['cases_per_min_wall']} cases/min over the wall time; per kind (their own time): "
             + ", ".join(f"{k} {v}/min" for k, v in res["cases_per_min_by_kind"].items()),
             f"- three-way cases per family ({len(res['three_way_by_family'])} families): "
             + (", ".join(f"{k} {v}" for k, v in res["three_way_by_family"].items()) or "none"),
             f"- feature-pair coverage: {len(res['pairs'])} of {res['pairs_total']} pairs of the spec's decorations "
             "exercised together (" + ", ".join(f"{k} {v}" for k, v in res["pairs_by_kind"].items())
             + "; the total counts every pair, mutually exclusive ones -- two KV backings, MLA with a GQA "
               "decoration -- included)"]
    for f in res["failures"]:
        lines += ["", f"## {f['kind']}: {f['label']}", "", f"{f['why']}", "", "```", f["reproduce"], "```"]
    if recorded:
        lines += ["", "recorded in: " + ", ".join(recorded)]
    lines += ["", "<details><summary>pairs exercised</summary>", "", ", ".join(res["pairs"]), "",
              "three-way (checked against the references):", "", ", ".join(res["three_way_pairs"]), "", "</details>"]
    return "\n".join(lines)
