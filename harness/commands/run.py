"""``conformance run``: one case, into a run directory, its table printed.
``conformance list``: what there is to run (families, references, candidates,
backends, probes)."""

from __future__ import annotations

import sys
import time

from ..cli import _add_case_args, _require_device, add_verbose, case_from_args


def register(sub) -> None:
    r = sub.add_parser("run", help="run one case and write reports/<run-id>/")
    _add_case_args(r)
    r.add_argument("--out", metavar="DIR", help="run directory (default ./reports/<run-id>)")
    add_verbose(r)
    r.set_defaults(fn=cmd_run)


def cmd_run(a) -> int:
    return cmd_run_case(lambda: case_from_args(a), a.policy, a.out)


def cmd_run_case(make_case, policy_path: str | None, out: str | None, command: str = "run") -> int:
    """Run one case (``make_case()``, called once the run directory is known to be
    usable) into a run directory, print its table; the exit status."""
    from .. import budget, report, runlog
    from ..case import CaseRun
    from ..policy import load_policy

    policy = load_policy(policy_path)
    run_id = report.new_run_id()
    d = report.check_out(out, run_id)  # before any work: a run never finds out at the end
    case = make_case()
    case.validate()
    _require_device(case)
    run = CaseRun(case, policy, progress=lambda m: print(m, file=sys.stderr))
    _ = run.layer_cfgs  # bad shapes are refused here, before anything is written
    budget.check(run)  # and a case the model or this machine cannot hold
    t0 = time.time()
    rows = run.rows()
    df = report.write_rows(d, rows)
    runlog.attach(d / runlog.LOG_NAME)
    report.write_meta(d, {"run_id": run_id, "command": command, "argv": sys.argv[1:], "case": case.to_dict(),
                          "candidate": run.candidate.name, "notes": run.notes,
                          "features": run.features, "timings": run.timings, "wall_s": time.time() - t0,
                          "plan": run.plan.meta(), "resources": budget.usage(), **run.meta_extra()})
    print(report.case_table(df))
    for note in run.notes:
        print(f"note: {note}")
    print(f"report: {d}")
    return report.exit_status(df)
