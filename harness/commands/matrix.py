"""``conformance matrix [SPEC]``: run every case of a matrix spec into one run
directory (default ``reports/<run-id>/``), in parallel workers, with a progress
bar, resumable, optionally as one deterministic shard of several."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
import json

from ..errors import UsageError
from ..specs import DEFAULT_SPEC, keyword_matcher, select  # noqa: F401 (the CLI's names for them)
from ..versions import ROOT
from harness.lazy import lazy
from ..cli import add_verbose
from ..progress import add_quiet
from .. import matrix, report, runlog
from ..views import run_model
from ..versions import drift_line
from ..views import case_status

rich_console = lazy("rich.console")
rich_progress = lazy("rich.progress")


def say_default(arg: str | None, spec, command: str) -> None:
    """Without a SPEC a command runs the default matrix, the whole of it: said on
    stderr with its size, once the input has passed every check."""
    if arg is None:
        print(f"conformance {command}: no SPEC given: the default matrix {DEFAULT_SPEC.relative_to(ROOT)} "
              f"({len(spec.cases)} cases); give a SPEC (e.g. fixtures/matrix/smoke.toml) for fewer",
              file=sys.stderr, flush=True)


def register(sub) -> None:
    p = sub.add_parser("matrix", help="run a matrix spec (default fixtures/matrix/default.toml) into reports/<run-id>/")
    p.add_argument("spec", nargs="?", metavar="SPEC", help="matrix spec TOML (default fixtures/matrix/default.toml)")
    add_run_args(p)
    p.add_argument("--shard", metavar="I/N", help="run only the I-th of N deterministic slices (join with `conformance merge`)")
    p.add_argument("--resume", metavar="DIR", help="complete an interrupted run in DIR (its spec and cases are in DIR)")
    p.add_argument("--list", action="store_true", help="print the cases the spec expands to, and exit")
    p.add_argument("-k", metavar="EXPR", dest="keyword",
                   help="only the cases whose id matches EXPR, as pytest's -k: substrings (case-insensitive) "
                        "joined by and / or / not and parentheses, e.g. -k 'qwen3 and paged and not bfloat16'")
    p.set_defaults(fn=cmd_matrix)


def add_run_args(p) -> None:
    p.add_argument("--out", metavar="DIR", help="run directory (default ./reports/<run-id>)")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: the CPU count; 1 runs in this process)")
    p.add_argument("--policy", metavar="TOML", help="tolerance policy (default fixtures/tolerance.toml)")
    p.add_argument("--plots", choices=("needed", "all", "none"), default="needed",
                   help="which cases get a PNG plot: needed (default: a case with a failing row or a finding), "
                        "all, or none")
    p.add_argument("--no-plots", action="store_true", help="no per-case PNG plots (as --plots none)")

    add_verbose(p)
    add_quiet(p)


def cmd_matrix(a) -> int:
    if a.jobs < 1:
        raise UsageError(f"-j/--jobs must be at least 1, got {a.jobs}")
    if a.resume:
        if a.spec or a.shard or a.out or a.policy or a.keyword:
            raise UsageError("--resume DIR takes the spec, shard, selection and policy recorded in DIR; give none of "
                             "SPEC, --shard, -k, --out, --policy")
        d = Path(a.resume)
        matrix.read_run(d)

        report.claim_out(str(d), "", resume=True)  # not while another command completes it
    else:
        spec = matrix.load_spec(a.spec or DEFAULT_SPEC)
        if a.keyword is not None:
            spec = select(spec, a.keyword)
        sh = matrix.parse_shard(a.shard)
        if a.list:
            say_default(a.spec, spec, "matrix")
            try:
                for c in matrix.shard(spec.cases, *sh) if sh else spec.cases:
                    print(c.case_id())
            except BrokenPipeError:  # `--list | head`: the reader has had enough
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        d = matrix.start(spec, a.out, sh, a.policy, a.jobs, sys.argv[1:])
        say_default(a.spec, spec, "matrix")
    return run_dir(d, a.jobs, plots_of(a), quiet=getattr(a, "quiet", False))[0]


def plots_of(a) -> str:
    """Which cases get a plot (``--plots``; ``--no-plots`` is ``none``)."""
    return "none" if a.no_plots else a.plots


def run_dir(d: Path, jobs: int, plots: bool | str, quiet: bool = False):
    """Complete the run in ``d`` with a progress display; ``(exit status, rows)``."""
    try:
        return _run_dir(d, jobs, plots, quiet)
    finally:
        report.release_out(Path(d))  # the lock claim_out took; the run directory stays (--resume)


def _run_dir(d: Path, jobs: int, plots: bool | str, quiet: bool = False):
    run = matrix.read_run(d)
    runlog.attach(Path(d) / runlog.LOG_NAME)
    total = len(run["cases"])
    held = matrix.Journal(d).records()
    ui = Progress(total, held, quiet)
    # A CI cancel sends SIGTERM: stop like Ctrl-C, so the workers are told to stop
    # and the journal keeps what finished (it is flushed case by case anyway).
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with ui:
            df, _ = matrix.complete(d, jobs, ui.start, ui.done, plots)
    except KeyboardInterrupt:
        # one message (main prints it): what is kept, and how to go on
        n = len(matrix.Journal(d).records())
        kept = (f"{n} of {total} cases finished and are kept" if n else "no case had finished")
        raise KeyboardInterrupt(f"{kept}; conformance matrix --resume {d} completes the run") from None
    finally:
        signal.signal(signal.SIGTERM, old)

    if not quiet:
        print(f"report: {d} (summary.md, report.html, junit.xml, rows.parquet)")
    startup = [i.get("worker_startup_s") for i in meta_info(d).values() if i.get("worker_startup_s") is not None]
    if startup and not quiet:
        print(f"worker start-up: {len(startup)} workers, {max(startup):.1f} s at most (not counted in any case's time)")

    if not drift_line().startswith("calibrated"):
        print(f"note: {drift_line()}", file=sys.stderr)
    print(run_model(df, {}).last_line())
    return report.exit_status(df), df


def meta_info(d: Path) -> dict:
    try:
        return json.loads((Path(d) / "meta.json").read_text()).get("case_info", {})
    except (OSError, ValueError):
        return {}


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class Progress:
    """A rich progress bar on a terminal (the cases in flight, a running
    pass / fail count); one line per finished case otherwise, for CI logs."""

    def __init__(self, total: int, held: dict, quiet: bool = False):
        self.total, self.n = total, len(held)
        self.tally: dict[str, int] = {}
        for rec in held.values():  # a resumed run counts what it already holds
            st = case_status(r["status"] for r in rec["rows"])
            self.tally[st] = self.tally.get(st, 0) + 1
        self.inflight: dict[str, float] = {}
        self.tty = sys.stderr.isatty() and not quiet
        self.quiet = quiet
        self.bar = None

    def __enter__(self):
        if self.n and not self.quiet:  # a resumed run
            print(f"resuming: {self.n} of {self.total} cases already done", file=sys.stderr, flush=True)
        if self.tty:
            self.bar = rich_progress.Progress(rich_progress.BarColumn(), rich_progress.MofNCompleteColumn(), rich_progress.TimeElapsedColumn(),
                                rich_progress.TextColumn("{task.description}"), console=rich_console.Console(stderr=True), transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=self.total, completed=self.n)
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def counts_line(self) -> str:
        return f"cases {self.n}/{self.total}: " + ", ".join(f"{k} {v}" for k, v in sorted(self.tally.items()))

    def _refresh(self):
        if self.bar:
            flight = ", ".join(self.inflight) or "-"
            self.bar.update(self.task, completed=self.n,
                            description=f"pass {self.tally.get('pass', 0)} fail "
                                        f"{self.tally.get('fail', 0) + self.tally.get('error', 0)} · {flight}")

    def start(self, case):
        self.inflight[case.case_id()] = time.perf_counter()
        self._refresh()

    def done(self, case, rec):
        cid = case.case_id()
        wall = time.perf_counter() - self.inflight.pop(cid, time.perf_counter())
        info = rec.get("info", {})
        t = info.get("timings", {}).get("case_s", wall)  # the case's own time, not its worker's start-up
        st = case_status(r["status"] for r in rec["rows"])
        self.tally[st] = self.tally.get(st, 0) + 1
        self.n += 1
        if self.bar:
            self._refresh()
        elif not self.quiet:
            up = info.get("worker_startup_s")
            extra = f"; worker start-up {up:.1f}s before it" if up is not None else ""
            print(f"[{self.n}/{self.total}] {st:<8} {cid} ({t:.1f}s{extra})", file=sys.stderr, flush=True)
