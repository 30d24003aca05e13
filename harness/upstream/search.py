"""Which release of a reference moved which result: run, diff, bisect, classify.

A *signature* of a run is, for every row of every case, what a verdict reads of
it: the status, the error's text (for an error), the decade of its NMSE. Two
releases whose signatures agree on a row computed the same verdict there; where
they differ, the releases between them are bisected to the first one that gives
the later value -- each release run once, only on the cases still in question,
its rows kept for every other question. Changes are then classified:

- ``adapter broke``: the release refused at start-up (a hook point it moved), or a
  row became an error, or a probe that passed is no longer exposed -- the adapter
  depends on something the release changed (an API change);
- ``adapter mended``: the reverse;
- ``divergence appeared`` / ``divergence closed``: a comparison that passed fails
  or becomes a finding (an excused divergence), or the reverse;
- ``divergence changed``: a failing row became a finding or the reverse;
- ``drift inside the tolerance``: the verdict is the same, the NMSE moved a decade.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
import os

from harness.lazy import lazy
from ..versions import ROOT

pd = lazy("pandas")

NMSE_FLOOR = 1e-30  # below this an NMSE is exactly-equal arithmetic: one class


def nmse_class(x) -> int | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return int(math.floor(math.log10(max(v, NMSE_FLOOR))))


_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+(\.\d+)?(e[-+]?\d+)?", re.I)


def reason_class(status: str, reason) -> str:
    """What of a row's reason a verdict reads: an error's or a not-exposed row's text
    (numbers and addresses dropped: a message that only quotes another size is the
    same message); nothing for a comparison (its reason quotes its numbers)."""
    if status in ("error", "not-exposed", "skipped"):
        return _VOLATILE.sub("#", str(reason or ""))[:200]
    return ""


Key = tuple  # (case_id, candidate, reference, layer, probe)


@dataclass
class Run:
    """One release's rows of some cases: ``values[key] = (status, reason class, nmse
    class)``; ``refused[case_id]`` the start-up refusal of the case's family (no row)."""

    release: str
    cases: set = field(default_factory=set)
    values: dict = field(default_factory=dict)
    nmse: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)  # an error or not-exposed row's text, for the report
    refused: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    out: Path | None = None

    def value(self, key: Key):
        if key[0] in self.refused:
            return ("refused", reason_class("error", self.refused[key[0]]), None)
        return self.values.get(key, ("absent", "", None))

    def add_rows(self, df) -> None:
        for r in df.itertuples(index=False):
            key = (r.case_id, r.candidate, r.reference, int(r.layer), r.probe)
            status = str(r.status)
            self.values[key] = (status, reason_class(status, r.reason), nmse_class(r.nmse) if status in
                                ("pass", "fail", "finding") else None)
            self.nmse[key] = r.nmse
            if status in ("error", "not-exposed", "skipped"):
                self.reasons[key] = str(r.reason)

    def reason(self, key: Key) -> str:
        return self.refused.get(key[0]) or self.reasons.get(key, "")


def classify(before: tuple, after: tuple) -> str:
    sb, sa = before[0], after[0]
    bad = ("error", "refused")
    if sa in bad and sb not in bad:
        return "adapter broke"
    if sb in bad and sa not in bad:
        return "adapter mended"
    if sb in bad and sa in bad:
        return "adapter broke" if before[1] != after[1] else "unchanged"
    # a row gone (its case errored, or the release no longer hands the probe over) or a
    # probe that passed and is now not exposed: what the adapter reads moved
    if (sa == "absent" and sb != "absent") or (sb == "pass" and sa == "not-exposed"):
        return "adapter broke"
    if (sb == "absent" and sa != "absent") or (sa == "pass" and sb == "not-exposed"):
        return "adapter mended"
    if sb == "pass" and sa in ("fail", "finding"):
        return "divergence appeared"
    if sa == "pass" and sb in ("fail", "finding"):
        return "divergence closed"
    if {sb, sa} == {"fail", "finding"}:
        return "divergence changed"
    if sb == sa and before[2] != after[2]:
        return "drift inside the tolerance"
    if sb != sa:
        return f"{sb} -> {sa}"
    return "unchanged" if before == after else "drift inside the tolerance"


@dataclass
class Change:
    key: Key
    release: str  # the first release that gives the new value
    previous: str  # the release before it
    before: tuple
    after: tuple
    kind: str
    nmse_before: float | None = None
    nmse_after: float | None = None


class Bisector:
    """Runs releases on demand (``run_release(release, case_ids) -> Run``) and keeps
    every row it has seen; ``changes(releases, anchors)`` finds, for every row whose
    value differs between adjacent anchors, the first release giving the new value."""

    def __init__(self, run_release, all_cases: list[str]):
        self.run_release = run_release
        self.all_cases = list(all_cases)
        self.runs: dict[str, Run] = {}
        self.order: list[str] = []  # the releases in the order they were run

    def run(self, release: str, cases) -> Run:
        have = self.runs.get(release)
        want = set(cases) - (have.cases if have else set())
        if want:
            got = self.run_release(release, sorted(want))
            if have is None:
                self.runs[release] = have = got
                self.order.append(release)
            else:
                have.cases |= got.cases
                have.values.update(got.values)
                have.nmse.update(got.nmse)
                have.reasons.update(got.reasons)
                have.sources.update(got.sources)
                have.refused.update(got.refused)
        return self.runs[release]

    def keys(self, *runs: Run) -> set:
        out = set()
        for r in runs:
            out |= set(r.values)
        return out

    def changes(self, releases: list[str], anchors: list[str]) -> list[Change]:
        idx = {r: i for i, r in enumerate(releases)}
        out: list[Change] = []
        for a, b in zip(anchors, anchors[1:]):
            ra, rb = self.run(a, self.all_cases), self.run(b, self.all_cases)
            keys = {k for k in self.keys(ra, rb) if ra.value(k) != rb.value(k)}
            self._split(releases, idx[a], idx[b], keys, out)
        return out

    def _split(self, releases, i: int, j: int, keys: set, out: list) -> None:
        if not keys:
            return
        ri, rj = self.runs[releases[i]], self.runs[releases[j]]
        if j == i + 1:
            for k in sorted(keys, key=str):
                bv, av = ri.value(k), rj.value(k)
                kind = classify(bv, av)
                if kind != "unchanged":
                    out.append(Change(k, releases[j], releases[i], bv, av, kind, ri.nmse.get(k), rj.nmse.get(k)))
            return
        m = (i + j) // 2
        rm = self.run(releases[m], {k[0] for k in keys})
        left = {k for k in keys if rm.value(k) != ri.value(k)}
        right = {k for k in keys if rm.value(k) != rj.value(k)}
        self._split(releases, i, m, left, out)
        self._split(releases, m, j, right, out)


RUNNER = Path(__file__).resolve().parent / "runner.py"


def run_in_env(python: Path, spec: str, case_ids: list[str], out: Path, jobs: int, release: str, log,
               tree: Path | None = None) -> Run:
    """The cases ``case_ids`` of ``spec`` run by the environment of ``python`` (runner.py),
    with the harness of ``tree`` (default: this checkout)."""

    tree = tree or ROOT

    out.mkdir(parents=True, exist_ok=True)
    n = len(list(out.glob("part-*")))
    part = out / f"part-{n}"
    ids = out / f"part-{n}.ids"
    ids.write_text("\n".join(case_ids) + "\n")
    log(f"{release}: running {len(case_ids)} case{'s' * (len(case_ids) != 1)}")
    # the runner's own file, run with the harness of `tree` first on the path (a file run as
    # a script would put its own folder first, where this package's modules would shadow others)
    boot = (f"import sys; sys.path.insert(0, {str(tree)!r}); "
            f"exec(compile(open({str(RUNNER)!r}).read(), {str(RUNNER)!r}, 'exec'))")
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([str(python), "-c", boot, spec, str(ids), str(part), str(jobs)],
                       capture_output=True, text=True, env=env)
    run = Run(release, set(case_ids), out=part)
    info_f = part / "upstream.json"
    if not info_f.is_file():
        tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        run.refused = {c: f"the run did not start (exit {r.returncode}): {tail}" for c in case_ids}
        return run
    info = json.loads(info_f.read_text())
    run.refused, run.sources, run.versions = info.get("refused") or {}, info.get("sources", {}), info.get("versions", {})
    rows = part / "run" / "rows.parquet"
    if rows.is_file():
        run.add_rows(pd.read_parquet(rows))
    missing = set(case_ids) - set(run.refused) - {k[0] for k in run.values}
    for c in missing:  # a case that left no row (the run died): said, not silently absent
        run.refused[c] = f"the run wrote no rows for it (exit {r.returncode})"
    return run
