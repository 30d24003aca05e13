"""``conformance run``: one case, into a run directory, its table printed.
``conformance list``: what there is to run (families, references, candidates,
backends, probes)."""

from __future__ import annotations

import json
import sys
import time

from ..cli import _add_case_args, _require_device, add_verbose, case_from_args
from ..progress import add_quiet
from .. import budget, references, report, runlog
from ..case import CaseRun
from ..policy import load_policy
from ..progress import Phases
from .. import views
from ..versions import drift_line


def register(sub) -> None:
    r = sub.add_parser("run", help="run one case and write reports/<run-id>/")
    _add_case_args(r)
    r.add_argument("--out", metavar="DIR", help="run directory (default ./reports/<run-id>)")
    r.add_argument("--no-plots", action="store_true", help="skip the case's PNG plot (report.html shows it)")
    add_verbose(r)
    add_quiet(r)
    r.set_defaults(fn=cmd_run)


def cmd_run(a) -> int:
    return cmd_run_case(lambda: case_from_args(a), a.policy, a.out, quiet=a.quiet, plots=not a.no_plots)


def cmd_run_case(make_case, policy_path: str | None, out: str | None, command: str = "run", quiet: bool = False,
                 plots: bool = True) -> int:
    """Run one case (``make_case()``, called once the run directory is known to be
    usable) into a run directory -- rows, meta.json and the views a matrix writes
    (summary.md, report.html, junit.xml): one case is one page too --, print its
    table (not with ``quiet``) and, last, the verdict line; the exit status."""

    policy = load_policy(policy_path)
    run_id = report.new_run_id()
    d = report.check_out(out, run_id)  # before any work: a run never finds out at the end
    case = make_case()
    case.validate()
    _require_device(case)
    phases = Phases(quiet)
    run = CaseRun(case, policy, progress=phases, warm=True)  # from its record where it has one (harness/warm.py)
    run.check_prompt()  # a prompt nothing can tokenize: refused from the config, before the model is built
    _ = run.layer_cfgs  # bad shapes are refused here, before anything is written
    # a reference release that moved what its adapter reads: one line, before any work (a
    # warm run -- its record was written by a cold run on these same versions, harness/warm.py
    # keys them -- calls no reference and imports neither torch nor transformers)
    if run.record is None:
        references.preflight(case.refs, run.family, run.config)
    budget.check(run)  # and a case the model or this machine cannot hold
    t0 = time.time()

    # the directory is this run's from here: another command into the same --out is
    # refused (report.claim_out's lock), and a run that finishes nothing leaves nothing
    d = report.claim_out(out, run_id)
    runlog.begin()  # this run's lines (a traceback) go to this run's log.txt
    df = None
    try:
        df = _run_into(d, run_id, run, case, command, phases, plots, t0, views)
    finally:
        report.release_out(d, keep=df is not None)
    if not quiet:
        print(report.case_table(df))
        for note in run.notes:
            print(f"note: {note}")
        print(f"report: {d} (summary.md, report.html, rows.parquet)")

    if not drift_line().startswith("calibrated"):  # a verdict made on another release than the lock's
        print(f"note: {drift_line()}", file=sys.stderr)
    print(views.run_model(df, {}).last_line())
    return report.exit_status(df)


def _run_into(d, run_id, run, case, command, phases, plots, t0, views):
    """The case's work, its rows and views written into ``d``; the rows' frame."""
    with phases:
        rows = run.rows()
        df = report.write_rows(d, rows)
        runlog.attach(d / runlog.LOG_NAME)
        report.write_meta(d, {"run_id": run_id, "command": command, "argv": sys.argv[1:], "case": case.to_dict(),
                              "spec": {"name": run.case.case_id(), "path": f"conformance {command}"},
                              "candidate": run.candidate.name, "notes": run.notes,
                              "features": run.features, "timings": run.timings, "wall_s": time.time() - t0,
                              "plan": run.plan.meta(), "resources": budget.usage(),
                              # built from the case's record (harness/warm.py), not from the model
                              "warm": run.record is not None, **run.meta_extra()})
        if plots:
            phases("drawing the plot")
            try:
                views.plot_case(df, d / "plots" / views.plot_name(run.case.case_id()))
            except Exception as e:  # noqa: BLE001 -- a plot is a view; its failure must not lose the rows
                print(f"note: no plot: {type(e).__name__}: {e}", file=sys.stderr)
        views.write_all(d, df, json.loads((d / "meta.json").read_text()))
    return df
