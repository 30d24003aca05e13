"""``conformance mutate [SPEC]``: the mutation self-test. Every mutant of the
registry (``harness/mutants``) is applied to impl -- in the worker process that
runs the case, never in a file -- and the spec's cases that exercise its
decoration are run under it. A mutant is KILLED when some case it runs has a
failing (or erroring) impl comparison; the mutation score is killed / total.

How a run goes:

1. every case of the spec (and each mutant's own declared case, unless
   ``--no-mutant-cases``) runs once WITHOUT any mutant: the baseline. It warms
   the reference captures (a mutant changes impl only, so every later run reads
   them back) and tells which cases pass clean -- a case that already fails
   cannot judge a mutant and is left out, and said so;
2. each mutant runs on the clean cases whose derived features include its
   decoration (a ``core`` mutant -- mask, positions, default scale, residual --
   on every clean case), then on its own declared case. A mutant whose
   decoration no case of the spec exercises runs on EVERY clean case of the
   spec, and the report says the spec lacks that decoration;
3. the report (``mutation.md``, ``mutation.json``, ``mutation_rows.parquet``:
   one row per mutant x case) names, for each mutant, the first case that killed
   it and the first divergence there (layer, probe, reference: ``first_divergence``,
   the same answer ``conformance bisect`` gives), how many of the cases it ran
   failed, and for a survivor the cases that should have caught it. A STALE
   mutant (its snippet no longer in impl) is an error and counts as not killed.

Exit status: 0 the score is at least ``--min-score`` (default 1.0: every mutant
killed), 1 below it, 2 bad input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import os
import numpy as np
import re
from dataclasses import replace as _replace
import importlib
from pathlib import Path as _P
from dataclasses import replace

from .. import atomic, references
from ..errors import UsageError, suggest
from harness.lazy import lazy
from ..cli import add_verbose
from ._mutant_case import MutantCase
from ..case import Case
from .. import matrix
from .. import mutants as mutants_pkg  # looked up at each call, as a test's patch of the module expects
from ..mutants import StaleMutant, applied
from ..bisect import FAILING, first_divergence
from ..verdict import candidate_rows
from ..features import SPEC_DECORATIONS
from .. import candidates
from ..mutants import _enclosing_def
from .. import report
from .matrix import DEFAULT_SPEC, say_default
from .. import runlog
from ..progress import Throttled
from ..policy import load_policy

pd = lazy("pandas")


SPEC_HELP = "matrix spec TOML (default fixtures/matrix/default.toml)"


def slice_of(case: Case) -> str:
    """The backend and dtype a case runs impl in: the mutation score is given per slice."""
    return f"{case.backend}-{case.dtype}"


def register(sub) -> None:
    p = sub.add_parser("mutate", help="mutation self-test: run a matrix spec under every mutant; the score "
                                      "is killed / total")
    p.add_argument("spec", nargs="?", metavar="SPEC", help=SPEC_HELP)
    p.add_argument("--out", metavar="DIR", help="run directory (default ./reports/<run-id>)")

    add_verbose(p)
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: the CPU count; 1 runs in this process)")
    p.add_argument("--policy", metavar="TOML", help="tolerance policy (default fixtures/tolerance.toml)")
    p.add_argument("--mutants", metavar="NAME,...",
                   help="only these mutants (their names: `conformance list`; each kind's live in "
                        "harness/kinds/<kind>/mutants)")
    p.add_argument("--decoration", metavar="TAG", help="only the mutants of this decoration (a feature tag)")
    p.add_argument("--no-mutant-cases", dest="mutant_cases", action="store_false",
                   help="do not also run each mutant's own declared case: score the spec's cases alone")
    p.add_argument("--first-kill", action="store_true",
                   help="stop running a mutant's cases once one has killed it (faster; the failure counts "
                        "then cover only the cases run)")
    p.add_argument("--min-score", type=float, default=1.0, metavar="F",
                   help="exit 1 when the mutation score (overall, or of any backend/dtype slice) is below F "
                        "(default 1.0)")
    p.add_argument("--candidate", default="impl", metavar="NAME",
                   help="mutate the code this candidate runs (default impl; torch-sdpa-kernel runs impl's body "
                        "with its own kernel): only the mutants that reach it count")
    p.add_argument("--ref", metavar="NAME",
                   help="judge every case against this reference alone (e.g. mlx: does a third witness catch "
                        "what the others catch?); a mutant no case can show it is reported out of sight, "
                        "with why, and is not scored")
    p.add_argument("--sensitivity", action="store_true",
                   help="for every parametric (subtle) mutant: the smallest relative perturbation of its parameter "
                        "that the spec's cases still catch, per backend and dtype")
    p.set_defaults(fn=cmd_mutate)


# ---------------------------------------------------------------- one task, in a worker
def work_mutant(case_dict: dict, policy_path: str | None, plot_dir: str | None) -> dict:
    """Run one case with one mutant applied (in a worker process, or in-process
    for -j1); return the verdict, not the rows."""

    d = dict(case_dict)
    name = d.pop("mutant")
    size = d.pop("mutant_d", None)
    cid = MutantCase(**Case.from_dict(d).__dict__, mutant=name, mutant_d=size).case_id()
    t = time.perf_counter()
    try:
        # a mutant may well compute inf - inf: the NaN is judged (a fail), the warning is noise
        with applied(mutants_pkg.registry()[name], size), np.errstate(all="ignore"):
            rec = matrix.work(d, policy_path, None)
    except StaleMutant as e:
        return {"case_id": cid, "mutant": name, "stale": str(e)}
    out = verdict(rec["rows"])
    out.update(case_id=cid, mutant=name, seconds=time.perf_counter() - t)
    if "traceback" in rec.get("info", {}):
        out["traceback"] = rec["info"]["traceback"]
    return out


def verdict(rows: list[dict]) -> dict:
    """Killed or not, and where: the first divergence of the case's candidate in dataflow order."""
    mine = candidate_rows(rows)
    failing = [r for r in mine if r["status"] in FAILING]
    name = mine[0]["candidate"] if mine else "impl"
    out = {"killed": bool(failing), "failing_rows": len(failing), "first": first_divergence(mine, candidate=name)}
    # judged against one witness (mutate --ref): a finding of that witness has no other
    # reference to guard it, so its probes are ``unguarded`` with or without a mutant --
    # what the witness saw is the rest
    seen = [r for r in mine if r["status"] != "unguarded"]
    bad = [r for r in seen if r["status"] in FAILING]
    out["witness"] = {"killed": bool(bad), "failing_rows": len(bad),
                      "first": first_divergence(seen, candidate=name) if bad else None,
                      "excused": excused(mine)}
    return out


def excused(rows: list[dict]) -> dict:
    """``{"layer/probe/reference": [nmse, the finding's label, or None for a pass]}`` of the
    rows that passed or that a finding excuses (``finding``, or ``unguarded`` where no other
    reference guards it): what a mutant's run moved, and where."""

    out = {}
    for r in rows:
        n = r.get("nmse")
        if r["status"] not in ("pass", "finding", "unguarded") or n is None or n != n:
            continue
        label = None
        if r["status"] != "pass":
            m = re.search(r"finding (\S+?)(?::| \()", r.get("reason") or "")
            label = m.group(1) if m else "?"
        out[f"{r['layer']}/{r['probe']}/{r['reference']}"] = [float(n), label]
    return out


def moved_inside(base_rows: dict, run_rows: dict, rel: float = 1e-6) -> list[str] | None:
    """The findings inside which alone a surviving mutant's run moved anything: their
    excused rows changed (NMSE by more than ``rel``, relative, or excused in one run and not
    the other -- a mutant that computes what the witness computes turns them into passes)
    and no row that passed did. None where a passing row moved: the mutant acted where the
    witness judges and stayed within its bounds -- a miss, not out of sight. Empty where
    nothing moved."""
    inside = set()
    for k in set(base_rows) | set(run_rows):
        b, n = base_rows.get(k), run_rows.get(k)
        if b is not None and n is not None and abs(n[0] - b[0]) <= rel * max(abs(b[0]), 1e-300) and b[1] == n[1]:
            continue
        labels = {x[1] for x in (b, n) if x is not None and x[1] is not None}
        if not labels:  # a passing row moved: judged, and not caught
            return None
        inside |= labels
    return sorted(inside)


def _no_pass_reason(rows: list[dict]) -> str:
    """Why a case's candidate rows hold no pass: the first row that says (a reference's
    not-implemented or skipped row carries its reason)."""
    for st in ("not-implemented", "skipped", "not-exposed"):
        r = next((r for r in rows if r["status"] == st and r.get("reason")), None)
        if r is not None:
            return f"{st}: {r['reason']}"
    return "no row compared" if not rows else f"only {', '.join(sorted({r['status'] for r in rows}))} rows"


# ---------------------------------------------------------------- the run
def select_mutants(names: str | None, decoration: str | None) -> list:
    reg = mutants_pkg.registry()
    chosen = list(reg.values())
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        for n in wanted:
            if n not in reg:
                raise UsageError(f"unknown mutant {n!r}; {suggest(n, sorted(reg))}")
        chosen = [reg[n] for n in wanted]
    if decoration:
        tags = sorted(set(SPEC_DECORATIONS) | {m.decoration for m in reg.values()})
        if decoration not in tags:
            raise UsageError(f"unknown decoration {decoration!r}; {suggest(decoration, tags)}")
        chosen = [m for m in chosen if m.decoration == decoration]
        if not chosen:
            raise UsageError(f"no mutant breaks decoration {decoration!r}"
                             + (" among --mutants" if names else ""))
    if not chosen:
        raise UsageError("no mutants selected")
    return chosen


def own_case(m, candidate: str = "impl", ref: str | None = None) -> Case:
    kw = dict(m.case)
    kw.setdefault("ref", references.default())
    if ref is not None:
        kw["ref"] = ref
    kw["overrides"] = tuple(tuple(x) for x in kw.get("overrides", ()))
    kw["candidate"] = candidate
    if candidate != "impl":
        # a candidate's own limits (torch-sdpa-kernel runs on torch) shape the case

        kw.update(candidates.get(candidate).mutant_case_fields())
    return Case(**kw)


def own_cases(mutants: list, spec_cases: list, candidate: str = "impl",
              ref: str | None = None) -> tuple[dict, dict]:
    """Each mutant's own declared case, and that case again in every other slice the spec
    runs where the mutant's break is visible: ``({name: case}, {name: [cases]})``. The
    score is given per backend/dtype slice, and a decoration tag is coarser than a
    mutant's code path (a q bias without a gate never reaches the gate's bias): the
    configuration where the mutant is known to act runs in each slice, so each slice is
    scored on a case that reaches the mutated line. ``mutate`` and ``mutate
    --sensitivity`` both take their cases from here: the two must agree on what caught
    a mutant (issue 41: --sensitivity ran the own case in its own slice only, and called
    yarn-beta-fast-plus-one uncaught at numpy/torch float32 where mutate killed it)."""

    own = {}
    for m in mutants:
        c = own_case(m, candidate, ref)
        try:
            c.validate()
        except UsageError as e:
            raise UsageError(f"mutant {m.name}: its declared case is invalid: {e}") from None
        own[m.name] = c
    spec_slices = sorted({(c.backend, c.dtype) for c in spec_cases})
    more: dict[str, list] = {}
    for m in mutants:
        c = own[m.name]
        for b, d in spec_slices:
            if (b, d) == (c.backend, c.dtype) or not m.visible_at(d):
                continue
            v = _replace(c, backend=b, dtype=d)
            try:
                v.validate()
            except UsageError:
                continue  # a slice this configuration cannot run in (the family on that backend)
            more.setdefault(m.name, []).append(v)
    return own, more


def applies(m, cand) -> str | None:
    """Why mutant ``m`` does not reach candidate ``cand``'s code, or None: it must
    lie in a module the candidate runs and not in a function it replaces."""

    if not any(m.module == mod or m.module.startswith(mod + ".") for mod in cand.runs_modules):
        return f"{cand.name} runs none of {m.module}'s code"
    src = _P(importlib.import_module(m.module).__file__).read_text()
    if src.count(m.old) != 1:
        return None  # stale: reported as such by the run
    owner, fname, _ = _enclosing_def(src, src.index(m.old))
    where = f"{m.module}.{owner + '.' if owner else ''}{fname}"
    if where in cand.replaces:
        return f"{cand.name} replaces {where}"
    return None


def with_fields(spec, **fields):
    """``spec`` with these fields set on every case, each case validated again (cases
    that then coincide are run once): ``ref=`` judges every case against one reference
    (``--ref``), ``candidate=`` with its own limits judges a candidate (``--candidate``)."""

    cases = []
    for c in spec.cases:
        c = replace(c, **fields)
        try:
            c.validate()
        except UsageError as e:
            raise UsageError(f"matrix spec {spec.path}, case {c.case_id()}: {e}") from None
        cases.append(c)
    return replace(spec, cases=list({c.case_id(): c for c in cases}.values()))


def for_candidate(spec, candidate: str):
    """``spec`` with every case judging ``candidate``."""
    if candidate == "impl":
        return spec

    return with_fields(spec, candidate=candidate, **candidates.get(candidate).mutant_case_fields())


def run_mutation(spec, mutants: list, jobs: int, policy_path: str | None, mutant_cases: bool = True,
                 first_kill: bool = False, log=lambda msg: None, phase=lambda msg: None,
                 candidate: str = "impl", ref: str | None = None) -> dict:
    """Baseline, then every mutant on the cases that exercise it; the result as plain data.
    ``log``: one line per finished run; ``phase``: one line per phase."""

    t0 = time.perf_counter()
    spec_cases = matrix.nonempty(spec)
    # stale mutants are found here, before anything runs (applying one only recompiles a function)
    stale = {}
    for m in mutants:
        try:
            with applied(m):
                pass
        except StaleMutant as e:
            stale[m.name] = str(e)
    live = [m for m in mutants if m.name not in stale]
    own, own_more = own_cases(live if mutant_cases else [], spec_cases, candidate, ref)
    spec_ids = [c.case_id() for c in spec_cases]
    by_id = {c.case_id(): c for c in spec_cases}
    for c in [*own.values(), *(v for vs in own_more.values() for v in vs)]:
        by_id.setdefault(c.case_id(), c)

    # 1. the baseline: every case, no mutant
    base: dict[str, dict] = {}

    def base_done(c, rec):
        mine = candidate_rows(rec["rows"])
        # against one witness alone its findings' probes are unguarded in every run: not a failure
        bad = [r for r in mine if r["status"] in FAILING and (ref is None or r["status"] != "unguarded")]
        # a case judges a mutant only where some comparison of the candidate passed
        # without it: a case whose every row is skipped or not-implemented (a family
        # the reference lacks) cannot catch anything, and must not count as a miss
        passed = any(r["status"] == "pass" for r in mine)
        why = (f"{bad[0]['status']} at layer {bad[0]['layer']} {bad[0]['probe']} vs {bad[0]['reference']}" if bad
               else "" if passed else "no comparison passed: " + _no_pass_reason(mine))
        base[c.case_id()] = {"features": rec["info"].get("features", []), "clean": not bad and passed,
                             "failing": bool(bad), "why": why, "excused": excused(mine) if ref is not None else {}}
        log(f"baseline [{len(base)}/{len(by_id)}] {'pass' if not bad else 'FAIL'} {c.case_id()}")

    tb = time.perf_counter()
    matrix.execute(matrix.run_order(list(by_id.values())), jobs, policy_path, None, lambda c: None, base_done)
    baseline_s = time.perf_counter() - tb
    phase(f"baseline: {len(by_id)} cases without a mutant in {baseline_s:.0f} s "
          f"({sum(1 for b in base.values() if b['failing'])} fail, "
          f"{sum(1 for b in base.values() if not b['clean'] and not b['failing'])} judge nothing)")

    # 2. the tasks: each mutant x the clean cases that exercise it (then its own case)
    plans: dict[str, dict] = {}
    tasks: list[MutantCase] = []
    clean_spec = [cid for cid in spec_ids if base[cid]["clean"]]
    for m in live:
        # only where its break is visible (Mutant.dtypes): a float16 overflow is not run at float64
        visible = [cid for cid in clean_spec if m.visible_at(by_id[cid].dtype)]
        targeted = [cid for cid in visible if m.core or m.decoration in base[cid]["features"]]
        oc = own.get(m.name)
        own_id = oc.case_id() if oc is not None else None
        # against one named reference, a mutant no judged case exercises is out of its
        # sight: it is not run on every case in the hope of a kill (that is the default
        # spec's fallback, where every case is judged by the references it was built for)
        cids = targeted or ([] if ref is not None else list(visible))
        if own_id is not None and own_id not in cids:
            if base[own_id]["clean"]:
                cids = cids + [own_id]
        cids = cids + [v.case_id() for v in own_more.get(m.name, [])
                       if v.case_id() not in cids and base[v.case_id()]["clean"]]
        exercising = [cid for cid in spec_ids if m.visible_at(by_id[cid].dtype)
                      and (m.core or m.decoration in base[cid]["features"])]
        exercising += [cid for cid in [own_id, *(v.case_id() for v in own_more.get(m.name, []))]
                       if cid is not None and cid not in exercising]
        plans[m.name] = {"targeted": bool(targeted), "cases": cids, "own_case": own_id, "exercising": exercising,
                         "own_case_clean": None if own_id is None else base[own_id]["clean"],
                         "should_catch": targeted + ([own_id] if own_id and own_id not in targeted else [])}
        tasks += [MutantCase(**by_id[cid].__dict__, mutant=m.name) for cid in cids]

    results: dict[str, dict] = {}
    killed_in: set = set()  # (mutant, slice)

    def done(c, rec):
        if "rows" in rec:  # the worker died twice on this task: the matrix's crash row
            rec = {**verdict(rec["rows"]), "case_id": c.case_id(), "mutant": c.mutant, "crashed": True}
        if ref is not None and "witness" in rec:
            rec = {**rec, **rec["witness"]}
        results[c.case_id()] = rec
        if rec.get("killed"):
            killed_in.add((c.mutant, slice_of(c)))
        log(f"[{len(results)}/{len(tasks)}] {'killed  ' if rec.get('killed') else 'survived'} {c.case_id()}")

    # --first-kill stops a mutant once it is killed in a case's slice: the score is per slice
    skip = (lambda c: (c.mutant, slice_of(c)) in killed_in) if first_kill else None
    tm = time.perf_counter()
    matrix.execute(tasks, jobs, policy_path, None, lambda c: None, done, task=work_mutant, skip=skip)
    mutants_s = time.perf_counter() - tm
    phase(f"mutants: {len(results)} runs of {len(live)} mutants in {mutants_s:.0f} s")

    # 3. the verdicts
    out = []
    for m in mutants:
        entry = {"name": m.name, "decoration": m.decoration, "module": m.module, "doc": m.doc,
                 "declared_probe": m.first_probe, "declared_layer": m.layer, "core": m.core}
        if m.name in stale:
            out.append({**entry, "status": "stale", "error": stale[m.name], "cases_run": 0, "cases_failed": 0,
                        "should_catch": []})
            continue
        plan = plans[m.name]
        recs = [(cid, results.get(f"{m.name}::{cid}")) for cid in plan["cases"]]
        ran = [(cid, r) for cid, r in recs if r is not None]
        stale_now = next((r["stale"] for _, r in ran if "stale" in r), None)
        kills = [(cid, r) for cid, r in ran if r.get("killed")]
        entry.update(targeted=plan["targeted"], own_case=plan["own_case"], own_case_clean=plan["own_case_clean"],
                     cases_run=len(ran), cases_failed=len(kills), should_catch=plan["should_catch"],
                     seconds=sum(r.get("seconds", 0.0) for _, r in ran))
        if stale_now:
            out.append({**entry, "status": "stale", "error": stale_now})
            continue
        if not plan["cases"]:
            if ref is not None and not any(base[cid]["failing"] for cid in plan["exercising"]):
                # judged against one named reference: no case it can compare reaches the
                # mutant (its family is not-implemented there, ...): out of its sight, said
                # why, and not scored -- a case that failed without the mutant is no excuse
                whys = sorted({base[cid]["why"] for cid in plan["exercising"]})
                out.append({**entry, "status": "unseen",
                            "error": f"no case {ref} judges reaches it" + (f" ({'; '.join(whys)[:300]})" if whys
                                                                          else "")})
                continue
            out.append({**entry, "status": "survived",
                        "error": "no case passes without the mutant, so none can judge it"})
            continue
        if kills:
            cid, r = kills[0]
            first = r["first"] or {}
            spec_kills = [k for k, _ in kills if k in by_id and k in spec_ids]
            entry.update(status="killed", killed_by=cid, killed_by_spec=bool(spec_kills),
                         first_spec_kill=spec_kills[0] if spec_kills else None,
                         reference=first.get("reference"), layer=first.get("layer"), probe=first.get("probe"),
                         row_status=first.get("status"), worst=first.get("worst", ""), nmse=first.get("nmse"),
                         max_abs=first.get("max_abs"), last_agreeing=first.get("last_agreeing"),
                         killed_cases=[k for k, _ in kills])
            # on the mutant's own case, the first divergence is where the mutant says it acts
            entry["probe_as_declared"] = None if cid != plan["own_case"] else (
                first.get("probe") == m.first_probe and (m.layer is None or first.get("layer") == m.layer))
        else:
            entry.update(status="survived")
            own_ids = [cid for cid in [plan["own_case"], *(v.case_id() for v in own_more.get(m.name, []))] if cid]
            moves = [moved_inside(base[cid]["excused"], r.get("excused") or {}) for cid, r in ran]
            inside = None if any(mv is None for mv in moves) else sorted({x for mv in moves for x in mv})
            if ref is not None and own_ids and all(not base[cid]["clean"] and not base[cid]["failing"]
                                                   for cid in own_ids):
                # its own case -- the configuration where it is declared to act (a decoration
                # tag is coarser than the mutated line) -- is one the witness cannot judge: the
                # other cases of its tag ran and may never reach the line; out of its sight
                entry.update(status="unseen", error=f"its own case is not judged by {ref} ("
                             + "; ".join(sorted({base[cid]["why"] for cid in own_ids}))[:300] + ")")
            elif ref is not None and inside is not None and ran:
                # it moved nothing the witness judges: only what its own divergences excuse
                # (it acts where that witness computes another model, or has this very bug),
                # or nothing it exposes at all (a state it keeps to itself, a probe it fuses)
                entry.update(status="unseen", error=(
                    f"it acts only inside {ref}'s own findings ({', '.join(inside)[:300]})" if inside else
                    f"it moved no probe {ref} exposes in the {len(ran)} cases that ran") + f": nothing {ref} judges moved")
        out.append(entry)

    # the score per backend and dtype: a mutant counts in a slice where some clean case of
    # that slice exercises its decoration (any case, for a core mutant) and its break is
    # visible at that precision (Mutant.dtypes); it is killed there when a case of that
    # slice failed under it
    slices: dict[str, dict] = {}
    hid: set = set()  # (mutant, slice): it moved only what the witness's findings excuse, or nothing
    judged_moved: set = set()  # ... and where it moved a row the witness judged, and was not caught
    unseen = {e["name"] for e in out if e["status"] == "unseen"}
    for m in live:
        plan = plans[m.name]
        if not plan["targeted"] or m.name in unseen:
            continue
        for cid in plan["cases"]:
            c = by_id[cid]
            sl = slice_of(c)
            if not m.visible_at(c.dtype):
                continue
            rec = results.get(f"{m.name}::{cid}")
            if ref is not None and rec is not None and not rec.get("killed"):
                mv = moved_inside(base[cid]["excused"], rec.get("excused") or {})
                if mv is None:
                    judged_moved.add((m.name, sl))
                else:  # in this slice it moved nothing the witness judges
                    hid.add((m.name, sl))
            e = slices.setdefault(sl, {"mutants": {}})
            e["mutants"][m.name] = e["mutants"].get(m.name, False) or bool(rec and rec.get("killed"))
    for sl, e in slices.items():
        e["mutants"] = {n: v for n, v in e["mutants"].items()
                        if v or (n, sl) not in hid or (n, sl) in judged_moved}
    slices = {sl: e for sl, e in slices.items() if e["mutants"]}
    for sl, e in slices.items():
        k = sum(e["mutants"].values())
        e.update(killed=k, total=len(e["mutants"]), score=k / len(e["mutants"]),
                 survivors=sorted(n for n, v in e["mutants"].items() if not v))

    total = sum(1 for e in out if e["status"] != "unseen")
    killed = sum(1 for e in out if e["status"] == "killed")
    by_spec = sum(1 for e in out if e.get("killed_by_spec"))
    exercised = sorted({f for cid in spec_ids for f in base[cid]["features"]})

    covered = {m.decoration for m in mutants_pkg.registry().values()}

    no_mutant = [t for t in exercised if t in SPEC_DECORATIONS and t not in covered
                 and t not in ("kv_decode", "kv_batched")]
    return {
        "spec": {"path": spec.path, "name": spec.name, "sha": spec.sha, "cases": len(spec_cases)},
        "mutant_cases": mutant_cases, "first_kill": first_kill, "jobs": jobs,
        "score": killed / total if total else 0.0, "killed": killed, "total": total, "ref": ref,
        "unseen": sorted(e["name"] for e in out if e["status"] == "unseen"),
        "killed_by_spec_cases": by_spec, "stale": sorted(stale),
        "baseline": {"cases": len(by_id), "failing": {cid: b["why"] for cid, b in base.items() if b["failing"]},
                     "judge_nothing": {cid: b["why"] for cid, b in base.items()
                                       if not b["clean"] and not b["failing"]},
                     "seconds": baseline_s},
        "tasks": len(tasks), "tasks_run": len(results), "seconds": time.perf_counter() - t0,
        "mutants_seconds": mutants_s,
        "decorations_without_mutant": no_mutant,
        "slices": {sl: {k: v for k, v in e.items() if k != "mutants"} for sl, e in sorted(slices.items())},
        "mutants": out,
        "rows": [{"mutant": r["mutant"], "case_id": cid.split("::", 1)[1], "killed": bool(r.get("killed")),
                  "failing_rows": r.get("failing_rows", 0), "stale": "stale" in r,
                  "reference": (r.get("first") or {}).get("reference"), "layer": (r.get("first") or {}).get("layer"),
                  "probe": (r.get("first") or {}).get("probe"), "nmse": (r.get("first") or {}).get("nmse"),
                  "seconds": r.get("seconds")}
                 for cid, r in results.items()],
    }


# ---------------------------------------------------------------- sensitivity
LADDER = 13  # perturbations d = param * 10^-k, k = 0 .. LADDER-1
CASES_PER_SLICE = 3


def run_sensitivity(spec, mutants: list, jobs: int, policy_path: str | None, log=lambda m: None,
                    phase=lambda m: None) -> dict:
    """Per parametric mutant and per backend/dtype slice: the smallest relative
    perturbation ``d`` of its parameter (on the ladder ``param * 10^-k``) that a
    clean case of the slice exercising its decoration still catches -- found by
    bisecting the ladder, assuming (as the errors are smooth in ``d``) that a
    larger perturbation is caught whenever a smaller one is."""

    chosen = [m for m in mutants if m.param is not None]
    if not chosen:
        raise UsageError("--sensitivity needs parametric mutants (harness/kinds/attention/mutants/subtle.py); none selected")
    t0 = time.perf_counter()
    spec_cases = matrix.nonempty(spec)
    by_id = {c.case_id(): c for c in spec_cases}
    own, more = own_cases(chosen, spec_cases)  # as `mutate` runs them: the own case in every slice
    mine = {m.name: [own[m.name], *more.get(m.name, [])] for m in chosen}
    for cs in mine.values():
        for c in cs:
            by_id.setdefault(c.case_id(), c)
    base: dict[str, dict] = {}

    def base_done(c, rec):
        impl = candidate_rows(rec["rows"])
        base[c.case_id()] = {"features": rec["info"].get("features", []),
                             "clean": bool(impl) and not any(r["status"] in FAILING for r in impl)}
        log(f"baseline [{len(base)}/{len(by_id)}] {c.case_id()}")

    matrix.execute(matrix.run_order(list(by_id.values())), jobs, policy_path, None, lambda c: None, base_done)
    phase(f"sensitivity baseline: {len(by_id)} cases in {time.perf_counter() - t0:.0f} s")
    # (mutant, slice) -> its cases (the mutant's own case first) and the bisection bounds
    todo: dict[tuple[str, str], dict] = {}
    for m in chosen:
        own_ids = [c.case_id() for c in mine[m.name]]
        ids = own_ids + [cid for cid in by_id if cid not in own_ids]
        for cid in ids:
            b = base[cid]
            if not b["clean"] or not (m.core or m.decoration in b["features"]):
                continue
            st = todo.setdefault((m.name, slice_of(by_id[cid])), {"cases": [], "lo": -1, "hi": LADDER, "m": m})
            if len(st["cases"]) < CASES_PER_SLICE:
                st["cases"].append(cid)
    rounds = 0
    while True:
        open_ = {k: st for k, st in todo.items() if st["hi"] - st["lo"] > 1 and st.get("done") is None}
        if not open_:
            break
        rounds += 1
        tasks, probe = [], {}
        for key, st in open_.items():
            k = 0 if st["lo"] < 0 and "tried0" not in st else (st["lo"] + st["hi"]) // 2
            st["tried0"] = True
            probe[key] = k
            d = st["m"].param * 10.0 ** -k
            tasks += [MutantCase(**by_id[cid].__dict__, mutant=key[0], mutant_d=d) for cid in st["cases"]]
        hits: dict[tuple[str, str], bool] = {}

        def done(c, rec, hits=hits):
            key = (c.mutant, slice_of(c))
            hits[key] = hits.get(key, False) or bool(rec.get("killed"))

        matrix.execute(tasks, jobs, policy_path, None, lambda c: None, done, task=work_mutant)
        for key, k in probe.items():
            st = todo[key]
            if hits.get(key):
                st["lo"] = k
            else:
                st["hi"] = k
                if k == 0:
                    st["done"] = "not caught at the default perturbation"
        phase(f"sensitivity round {rounds}: {len(tasks)} runs, {len(open_)} open")
    out = []
    for (name, sl), st in sorted(todo.items()):
        m = st["m"]
        out.append({"mutant": name, "decoration": m.decoration, "slice": sl, "param": m.param,
                    "visible": m.visible_at(sl.rsplit("-", 1)[-1]),
                    "smallest_caught": None if st["lo"] < 0 else m.param * 10.0 ** -st["lo"],
                    "floor_of_ladder": st["lo"] == LADDER - 1, "cases": st["cases"]})
    return {"spec": {"path": spec.path, "name": spec.name}, "rounds": rounds, "seconds": time.perf_counter() - t0,
            "rows": out}


def render_sensitivity(res: dict) -> str:
    slices = sorted({r["slice"] for r in res["rows"]})
    by = {}
    for r in res["rows"]:
        by.setdefault((r["decoration"], r["mutant"], r["param"]), {})[r["slice"]] = r
    lines = [f"# Sensitivity: {res['spec']['name']} ({res['spec']['path']})", "",
             "The smallest relative perturbation of each parameter the spec's cases still catch "
             f"(ladder param x 10^-k, k < {LADDER}; '-': no case of that slice exercises it; "
             "'not caught': not even the default perturbation).", "",
             "| decoration | mutant | default | " + " | ".join(slices) + " |", "|---|---|---|" + "---|" * len(slices)]
    for (dec, name, param), cells in sorted(by.items()):
        vals = []
        for sl in slices:
            r = cells.get(sl)
            if r is None:
                vals.append("-")
            elif r["smallest_caught"] is None:
                vals.append("not caught" + ("" if r.get("visible", True) else " (below its rounding)"))
            else:
                vals.append(("<= " if r["floor_of_ladder"] else "") + f"{abs(r['smallest_caught']):.0e}")
        lines.append(f"| {dec} | {name} | {abs(param):g} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the report
def _short(case_id: str | None) -> str:
    return "-" if not case_id else case_id


def render(res: dict) -> str:
    """mutation.md: the score, the table, the survivors and what should have caught them."""
    lines = [f"# Mutation self-test: {res['spec']['name']} ({res['spec']['path']})", ""]
    lines.append(f"**Mutation score: {res['killed']}/{res['total']} = {100 * res['score']:.1f}%**"
                 + (f" ({res['killed_by_spec_cases']} killed by the spec's own cases)" if res["mutant_cases"] else
                    " (the spec's cases alone)"))
    lines.append("")
    lines.append(f"{res['spec']['cases']} spec cases"
                 + (", plus each mutant's own declared case" if res["mutant_cases"] else "")
                 + f"; {res['tasks_run']} mutant x case runs"
                 + (" (each mutant stopped at its first kill)" if res["first_kill"] else "")
                 + f"; {res['seconds']:.0f} s (baseline {res['baseline']['seconds']:.0f} s).")
    if res.get("slices"):
        lines += ["", "Per backend and dtype (a mutant counts where a case of that slice exercises its decoration "
                  "and its break is visible at that precision):", "", "| backend-dtype | killed / mutants | survivors |",
                  "|---|---|---|"]
        lines += [f"| {sl} | {e['killed']}/{e['total']} | {', '.join(e['survivors']) or '-'} |"
                  for sl, e in res["slices"].items()]
    if res["baseline"]["failing"]:
        lines += ["", f"{len(res['baseline']['failing'])} case(s) fail WITHOUT any mutant and judge none:"]
        lines += [f"- `{cid}`: {why}" for cid, why in sorted(res["baseline"]["failing"].items())]
    if res["decorations_without_mutant"]:
        lines += ["", "Decorations the spec exercises that no mutant breaks: "
                  + ", ".join(res["decorations_without_mutant"])]
    lines += ["", "| mutant | decoration | status | killed first by | reference | layer | probe | failed / run |",
              "|---|---|---|---|---|---|---|---|"]
    for e in res["mutants"]:
        where = ("" if e.get("targeted", True) else " (no spec case exercises it: ran every case)")
        if e["status"] == "killed" and not e.get("killed_by_spec"):
            where += " by its own case only"
        probe = e.get("probe") or "-"
        if e.get("probe_as_declared") is False:
            probe += f" (declared {e['declared_probe']})"
        lines.append(f"| {e['name']} | {e['decoration']}{' (core)' if e.get('core') else ''} | {e['status']}{where} "
                     f"| `{_short(e.get('killed_by'))}` | {e.get('reference') or '-'} "
                     f"| {'-' if e.get('layer') is None else e['layer']} | {probe} "
                     f"| {e.get('cases_failed', 0)} / {e.get('cases_run', 0)} |")
    bad = [e for e in res["mutants"] if e["status"] != "killed"]
    if bad:
        lines += ["", "## Not killed", ""]
        for e in bad:
            lines.append(f"- **{e['name']}** ({e['decoration']}, {e['status']}): {e.get('doc', '')}")
            if e.get("error"):
                lines.append(f"  - {e['error']}")
            if e.get("should_catch"):
                lines.append("  - cases that should have caught it: "
                             + ", ".join(f"`{c}`" for c in e["should_catch"]))
            elif e["status"] == "survived":
                lines.append(f"  - no case of the spec exercises {e['decoration']}")
    return "\n".join(lines) + "\n"


def table(res: dict) -> str:
    """The terminal summary."""
    w = max(len(e["name"]) for e in res["mutants"])
    out = []
    for e in res["mutants"]:
        if e["status"] == "killed":
            at = f"layer {e['layer']} {e['probe']} vs {e['reference']}"
            how = f"{e['cases_failed']}/{e['cases_run']} cases; first: {e['killed_by']} ({at})"
        elif e["status"] in ("stale", "unseen"):
            how = e.get("error", "")
        else:
            how = (f"{e.get('cases_run', 0)} cases ran; should have caught it: "
                   + (", ".join(e.get("should_catch") or []) or f"none (no case exercises {e['decoration']})"))
        out.append(f"{e['name']:<{w}}  {e['decoration']:<20} {e['status']:<8} {how}")
    out.append(f"mutation score {res['killed']}/{res['total']} = {100 * res['score']:.1f}%"
               + (f" ({res['killed_by_spec_cases']} killed by spec cases)" if res["mutant_cases"] else "")
               + (f"; against {res['ref']} alone, {len(res['unseen'])} mutants out of its sight, not scored"
                  if res.get("ref") else ""))
    for sl, e in res.get("slices", {}).items():
        out.append(f"  {sl:<18} {e['killed']}/{e['total']}" + (f"  survivors: {', '.join(e['survivors'])}"
                                                                if e["survivors"] else ""))
    return "\n".join(out)


def write(d: Path, res: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    atomic.write_text(d / "mutation.json", json.dumps(res, indent=1, default=str))
    atomic.write_text(d / "mutation.md", render(res))
    pd.DataFrame(res["rows"]).to_parquet(d / "mutation_rows.parquet", index=False)


def cmd_mutate(a) -> int:
    if a.jobs < 1:
        raise UsageError(f"-j/--jobs must be at least 1, got {a.jobs}")
    if not 0.0 <= a.min_score <= 1.0:
        raise UsageError(f"--min-score takes a fraction between 0 and 1, got {a.min_score}")
    spec = matrix.load_spec(a.spec or DEFAULT_SPEC)
    mutants = select_mutants(a.mutants, a.decoration)
    if a.candidate != "impl":
        if a.sensitivity:
            raise UsageError("--sensitivity measures impl's parameters; give no --candidate")
        cand = candidates.get(a.candidate)
        skipped = {m.name: why for m in mutants if (why := applies(m, cand))}
        if len(skipped) == len(mutants):
            raise UsageError(f"no selected mutant reaches candidate {a.candidate}: "
                             f"{next(iter(skipped.values()))} (mutants change impl; see harness/mutants)")
        for name, why in skipped.items():
            print(f"mutant {name}: not applicable ({why})", file=sys.stderr)
        mutants = [m for m in mutants if m.name not in skipped]
        spec = for_candidate(spec, a.candidate)
    if a.ref is not None:
        if a.sensitivity:
            raise UsageError("--sensitivity measures against the spec's own references; give no --ref")
        Case(family="llama", ref=a.ref).validate()  # an unknown name: one line naming the valid ones
        if a.ref == "all" or "," in a.ref:
            raise UsageError(f"--ref takes one reference, got {a.ref!r}; one of {', '.join(references.names())}")
        if not references.get(a.ref).available():
            raise UsageError(f"--ref {a.ref}: reference {a.ref} is not installed "
                             f"(pip install -e '.[{references.get(a.ref).requires}]')")
        spec = with_fields(spec, ref=a.ref)
    if a.policy:
        load_policy(a.policy)
    matrix.nonempty(spec)
    run_id = report.new_run_id()
    d = report.check_out(a.out, run_id)
    made = not d.exists()
    d.mkdir(parents=True, exist_ok=True)  # now: the workers append to its log.txt

    runlog.attach(d / runlog.LOG_NAME)

    def say(msg):
        print(msg, file=sys.stderr, flush=True)

    say_default(a.spec, spec, "mutate")
    # a terminal gets a line per mutant run; a CI log one per phase, and the latest run at
    # most every 30 s between (issue 41: mutate said nothing for minutes off a terminal)
    quiet = not sys.stderr.isatty()

    every = Throttled("mutate: ", every=30.0)
    if a.sensitivity:
        say(f"mutate --sensitivity: {sum(m.param is not None for m in mutants)} parametric mutants on {spec.path}")
        res = run_sensitivity(spec, mutants, a.jobs, a.policy, log=every if quiet else say, phase=say)
        d.mkdir(parents=True, exist_ok=True)
        atomic.write_text(d / "sensitivity.json", json.dumps(res, indent=1, default=str))
        md = render_sensitivity(res)
        atomic.write_text(d / "sensitivity.md", md)
        print(md)
        print(f"report: {d} (sensitivity.md, sensitivity.json)")
        # a perturbation below a precision's own rounding (Mutant.dtypes) is not expected to be caught there
        missed = [r for r in res["rows"] if r["visible"] and r["smallest_caught"] is None]
        print(f"{'FAIL' if missed else 'PASS'}: {len(missed)} visible parametric mutant slices never caught "
              f"(of {sum(1 for r in res['rows'] if r['visible'])})")
        return 0 if not missed else 1
    say(f"mutate: {len(mutants)} mutants on {spec.path} ({len(spec.cases)} cases), -j {a.jobs}")
    try:
        res = run_mutation(spec, mutants, a.jobs, a.policy, a.mutant_cases, a.first_kill,
                           log=every if quiet else say, phase=say, candidate=a.candidate, ref=a.ref)
    except UsageError:  # refused before any work (a mutant's own case): leave nothing behind
        if made:
            report.remove_partial(d)
        else:
            (d / runlog.LOG_NAME).unlink(missing_ok=True)
        raise
    res.update(run_id=run_id, argv=sys.argv[1:], min_score=a.min_score, candidate=a.candidate)
    write(d, res)
    print(table(res))
    print(f"report: {d} (mutation.md, mutation.json, mutation_rows.parquet)")
    low = [sl for sl, e in res.get("slices", {}).items() if e["score"] < a.min_score]
    ok = res["score"] >= a.min_score and not res["stale"] and not low
    # the last line, as every judging command ends: this one judges the matrix itself
    print(f"{'PASS' if ok else 'FAIL'}: mutation score {res['score']:.0%}, {res['killed']} of {res['total']} "
          f"mutants killed (at least {a.min_score:.0%} needed)"
          + (f"; below it in {', '.join(low)}" if low else "") + (f"; {len(res['stale'])} stale" if res["stale"] else ""))
    return 0 if ok else 1
