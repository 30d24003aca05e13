"""``conformance upstream PACKAGE A..B``: which release of a reference moved which
result (harness/upstream/). Exit status: 0 no release in the range changed a
verdict (drift inside the tolerance may be listed), 1 one did, 2 bad input."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import UsageError
from ..cli import add_verbose
from .. import report as rep
from .. import upstream
from ..upstream import envs
from ..upstream import report as urep
from ..upstream.search import Change
from ..versions import ROOT
from ..specs import DEFAULT_SPEC
from .. import runlog


def register(sub) -> None:
    p = sub.add_parser("upstream", help="bisect a reference's releases: which release moved which result, with the "
                                        "source hunks")
    p.add_argument("package", metavar="PACKAGE",
                   help="the reference's package: transformers (hf) or llama-cpp-python (llamacpp)")
    p.add_argument("range", metavar="A..B",
                   help="releases, inclusive: e.g. 5.20.0..5.25.0; 'pinned' is the lock's, 'latest' the newest")
    p.add_argument("--spec", metavar="TOML", help="matrix spec (default fixtures/matrix/default.toml)")
    p.add_argument("--family", action="append", metavar="NAME", help="only this family's cases (repeatable)")
    p.add_argument("-k", metavar="EXPR", dest="keyword", help="only the cases whose id matches EXPR (as matrix -k)")
    p.add_argument("--out", metavar="DIR", help="report directory (default ./reports/upstream-<run-id>)")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes per run")
    p.add_argument("--baseline", metavar="DIR", default=None,
                   help="the calibrated run to compare the lock's release with (default fixtures/baselines/default)")
    p.add_argument("--find-links", metavar="DIR",
                   help="take releases from this folder of wheels only, not the registry (a mirror; planted releases)")
    p.add_argument("--pre", action="store_true", help="include pre-releases")
    p.add_argument("--every", action="store_true", help="run every release of the range, not only what bisection needs")
    p.add_argument("--harness", metavar="REV",
                   help="run the harness of this git commit in every release (replay what that commit saw: an "
                        "adapter a release broke there); default this checkout")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the report's path and the last line")

    add_verbose(p)  # transformers' own chatter to <out>/log.txt (stderr with -v)
    p.set_defaults(fn=cmd_upstream)


def cmd_upstream(a) -> int:
    if a.jobs < 1:
        raise UsageError(f"-j/--jobs must be at least 1, got {a.jobs}")
    if a.find_links and not Path(a.find_links).is_dir():
        raise UsageError(f"--find-links {a.find_links!r} is not a folder")
    index = envs.Index(a.find_links)
    spec = a.spec or str(DEFAULT_SPEC)
    p = upstream.plan(a.package, a.range, spec, a.family, a.keyword, index, a.pre, a.every)
    tree = upstream.harness_tree(a.harness)
    run_id = rep.new_run_id()
    out = rep.check_out(a.out or str(Path.cwd() / "reports" / f"upstream-{run_id}"), run_id)
    out.mkdir(parents=True, exist_ok=True)

    runlog.attach(out / runlog.LOG_NAME)
    log = (lambda s: None) if a.quiet else (lambda s: print(f"upstream: {s}", file=sys.stderr, flush=True))
    log(f"{p.dist} {p.releases[0]}..{p.releases[-1]}: {len(p.releases)} releases, {len(p.case_ids)} cases; "
        f"first {', '.join(p.anchors)}")
    b, changes, meta = upstream.execute(p, out, a.jobs, index, log, tree)
    meta["harness_rev"], meta["harness_tree"] = a.harness, (str(tree) if tree else None)
    baseline = Path(a.baseline) if a.baseline else ROOT / "fixtures" / "baselines" / "default"
    base = upstream.baseline_check(b, p.calibrated, baseline)
    md = urep.markdown(p, b, changes, meta, base, a.find_links)
    (out / "report.md").write_text(md)
    (out / "changes.json").write_text(urep.changes_json(changes))
    verdict = [c for c in changes if c.kind in upstream.VERDICT_KINDS]
    if not a.quiet:
        sys.stdout.write(md)
    print(f"report: {out / 'report.md'}")
    rels = sorted({c.release for c in verdict})
    print(f"{'CHANGED' if verdict else 'UNCHANGED'}: {len(verdict)} row(s) whose verdict a release changed"
          + (f" (first in {', '.join(rels)})" if rels else "") + f"; {len(changes) - len(verdict)} drifted; "
          f"{len(b.runs)} release(s) run in {meta['wall_s']} s")
    return 1 if verdict else 0
