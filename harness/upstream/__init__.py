"""``conformance upstream``: which release of a reference moved which result.

Given a reference's package (transformers, llama-cpp-python) and a range of its
releases on the registry, it installs each release it needs into an environment
of its own (envs.py, kept in the cache), runs a matrix spec there (runner.py),
and bisects every row whose verdict differs between the ends of the range -- and
the calibrated release, the lock's, when it lies inside -- to the first release
that changed it (bisect.py). The report names each change's kind, the hunks of
the reference's own source between the two adjacent releases in the files the
family reads (sources.py), the packages the release brought with it, and the
command that reproduces it; and how the calibrated release's run compares with the
committed baseline.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
import sys
import shutil
import subprocess

from ..errors import UsageError, suggest
from ..versions import ROOT, norm, read_lock, versions
from . import envs, sources
from .search import Bisector, Change, Run, run_in_env
from harness.lazy import lazy
from .. import families as fams
from .. import matrix
from ..specs import select
from ..versions import cache_root

packaging_version = lazy("packaging.version")
pd = lazy("pandas")

# the reference packages the command bisects, by the names a user may give
PACKAGES = {"transformers": "transformers", "hf": "transformers", "hf_cached": "transformers",
            "llama-cpp-python": "llama-cpp-python", "llama_cpp_python": "llama-cpp-python",
            "llamacpp": "llama-cpp-python", "llama.cpp": "llama-cpp-python"}
KINDS = ("adapter broke", "divergence appeared", "divergence changed", "divergence closed", "adapter mended",
         "drift inside the tolerance")
# kinds a verdict changes with: the command exits 1 when one is found (the weekly job's signal)
VERDICT_KINDS = KINDS[:5]


@dataclass
class Plan:
    dist: str
    releases: list[str]  # the range, oldest first
    anchors: list[str]  # the ends, and the calibrated release where it lies inside
    calibrated: str | None
    spec: str
    case_ids: list[str]
    cases: dict = field(default_factory=dict)  # id -> Case


def parse_range(text: str, dist: str, index: envs.Index, pre: bool = False) -> list[str]:
    """``A..B`` (inclusive; ``pinned`` is the lock's release, ``latest`` the newest) ->
    the releases of ``dist`` in it, oldest first."""

    lo, sep, hi = text.partition("..")
    if not sep:
        raise UsageError(f"range {text!r} is not A..B, e.g. 5.20.0..5.25.0 or pinned..latest")
    avail = envs.releases(dist, index, pre)
    pinned = read_lock().get(norm(dist))

    def resolve(v: str, end: str) -> str:
        v = v.strip()
        if v in ("latest", ""):
            return avail[-1] if end == "hi" else avail[0]
        if v == "pinned":
            if not pinned:
                raise UsageError(f"{dist} is not in lock.txt: give a release, not 'pinned'")
            return pinned
        if v not in avail:
            raise UsageError(f"{dist} {v} is not a release on {index.find_links or 'the registry'}; "
                             f"{suggest(v, avail[-12:])}")
        return v

    a, b = resolve(lo, "lo"), resolve(hi, "hi")
    try:
        if packaging_version.Version(a) > packaging_version.Version(b):
            raise UsageError(f"range {text!r} runs backwards: {a} is newer than {b}")
    except packaging_version.InvalidVersion:
        pass
    return [v for v in avail if packaging_version.Version(a) <= packaging_version.Version(v) <= packaging_version.Version(b)]


def plan(reference: str, rng: str, spec_path: str, families: list[str] | None, keyword: str | None,
         index: envs.Index, pre: bool = False, every: bool = False) -> Plan:
    dist = PACKAGES.get(reference)
    if dist is None:
        raise UsageError(f"unknown reference package {reference!r}; {suggest(reference, sorted(set(PACKAGES)))}")
    spec = matrix.load_spec(spec_path)
    if keyword:
        spec = select(spec, keyword)
    cases = spec.cases
    if families:
        for f in families:
            fams.get(f)  # an unknown family: one line naming the valid ones
        cases = [c for c in cases if c.family in families]
        if not cases:
            raise UsageError(f"{spec_path} has no case of {', '.join(families)}")
    releases = parse_range(rng, dist, index, pre)
    cal = read_lock().get(norm(dist))
    anchors = list(releases) if every else sorted({releases[0], releases[-1], *([cal] if cal in releases else [])},
                                                  key=releases.index)
    return Plan(dist, releases, anchors, cal, str(spec.path), [c.case_id() for c in cases],
                {c.case_id(): c for c in cases})


def python_for(dist: str, release: str, index: envs.Index, log) -> Path:
    """The release's environment; the project's own for the calibrated (installed) one."""
    have = versions().get(dist.replace("-", "_"))
    if have is not None and have.split("+", 1)[0] == release and index.find_links is None:
        return Path(sys.executable)
    return envs.release_env(dist, release, index, log)


def execute(p: Plan, out: Path, jobs: int, index: envs.Index, log, tree: Path | None = None
            ) -> tuple[Bisector, list[Change], dict]:
    pythons: dict[str, Path] = {}
    errors: dict[str, str] = {}

    def run_release(release: str, case_ids: list[str]) -> Run:
        try:
            py = pythons.get(release) or python_for(p.dist, release, index, log)
        except envs.EnvError as e:
            errors[release] = str(e)
            return Run(release, set(case_ids), refused={c: f"{p.dist} {release} could not be installed: {e}"
                                                        for c in case_ids})
        pythons[release] = py
        spec = p.spec if tree is None or not p.spec.startswith(str(ROOT)) else str(tree / Path(p.spec).relative_to(ROOT))
        return run_in_env(py, spec, case_ids, out / "runs" / f"{p.dist}-{release}", jobs, release, log, tree)

    b = Bisector(run_release, p.case_ids)
    t0 = time.time()
    changes = b.changes(p.releases, p.anchors)
    return b, changes, {"pythons": {k: str(v) for k, v in pythons.items()}, "errors": errors,
                        "wall_s": round(time.time() - t0, 1)}


def baseline_check(b: Bisector, cal: str | None, baseline: Path | None) -> dict | None:
    """How the calibrated release's run compares with the committed baseline's rows of
    the same cases (a harness change or another machine shows here, not as a release's)."""

    if cal is None or cal not in b.runs or baseline is None or not (baseline / "rows.parquet").is_file():
        return None
    base = Run("baseline")
    df = pd.read_parquet(baseline / "rows.parquet")
    run = b.runs[cal]
    df = df[df["case_id"].isin(run.cases)]
    if df.empty:
        return {"cases": 0}
    base.add_rows(df)
    keys = set(base.values) | {k for k in run.values if k[0] in set(df["case_id"])}
    differ = [k for k in keys if base.value(k)[:2] != run.value(k)[:2]]
    drift = [k for k in keys if base.value(k)[:2] == run.value(k)[:2] and base.value(k) != run.value(k)]
    return {"cases": int(df["case_id"].nunique()), "rows": len(keys), "status_differs": len(differ),
            "nmse_class_differs": len(drift), "examples": [list(map(str, k)) for k in sorted(differ, key=str)[:10]]}


def harness_tree(rev: str | None) -> Path | None:
    """The harness of git revision ``rev`` as a folder (``git archive``, once per commit,
    in the cache): ``--harness REV`` replays what that commit's adapter saw of each
    release. None: this checkout."""

    if rev is None:
        return None
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                       capture_output=True, text=True)
    sha = r.stdout.strip()
    if r.returncode != 0 or not sha:
        raise UsageError(f"--harness {rev!r} is not a commit of this repository ({ROOT}); give a hash, tag or branch")
    d = cache_root() / "upstream" / "harness" / sha
    if (d / "harness" / "__init__.py").is_file():
        return d
    tmp = d.with_name(sha + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    arc = subprocess.run(["git", "-C", str(ROOT), "archive", sha], capture_output=True)
    if arc.returncode != 0:
        raise UsageError(f"--harness {rev!r}: git archive failed: {arc.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=arc.stdout, check=True)
    if d.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(d)
    return d


def family_of(case_id: str) -> str:
    return case_id.split("/", 1)[0]
