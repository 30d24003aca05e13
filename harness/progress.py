"""What a long command shows while it works (issue 29, finding 3: a large `run`
printed nothing for 300 s).

On a terminal, a rich status line on stderr: the phase (building the model,
capturing a reference, the float64 oracle, judging layer i of n), a bar where
the phase counts something, and the time spent; it is cleared when the work
ends. Not on a terminal (CI logs, pipes) a plain line on stderr as each phase
begins, with the time so far -- a 300 s `run` in a CI log no longer says nothing
until its end (issue 41) -- and nothing with ``-q``: stdout keeps only what the
command reports.
"""

from __future__ import annotations

import sys
import time

from harness.lazy import lazy
from . import interrupt

rich_console = lazy("rich.console")
rich_progress = lazy("rich.progress")


class Throttled:
    """Print ``message`` on ``stream`` at most once every ``every`` seconds (the latest
    message wins): a long loop's progress in a log, without a line per step."""

    def __init__(self, prefix: str = "", every: float = 20.0, stream=None):
        self.prefix, self.every = prefix, every
        self.stream = stream or sys.stderr
        self.t0 = self.last = time.monotonic()

    def __call__(self, message: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            print(f"{self.prefix}[{now - self.t0:6.1f}s] {message}", file=self.stream, flush=True)


def add_quiet(p) -> None:
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress display and no table: only the last line (PASS / FAIL / ERROR with the counts)")


class Phases:
    """``progress(message, done=None, total=None)``: the callback ``CaseRun`` is
    given; a context manager around the work."""

    def __init__(self, quiet: bool = False, stream=None):
        self.stream = stream or sys.stderr
        self.live = not quiet and self.stream.isatty()
        self.bar = None
        # off a terminal: one line per phase as it begins (a phase's own counter is not a new line)
        self.plain = None if quiet or self.live else Throttled("run: ", every=0.0, stream=self.stream)
        self.said = None

    def __enter__(self):
        if self.live:
            self.bar = rich_progress.Progress(rich_progress.SpinnerColumn(), rich_progress.TextColumn("{task.description}"), rich_progress.BarColumn(), rich_progress.MofNCompleteColumn(),
                                rich_progress.TimeElapsedColumn(), console=rich_console.Console(file=self.stream), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
            self.bar = None

    def __call__(self, message: str, done: int | None = None, total: int | None = None) -> None:
        interrupt.check()  # each phase and layer of a case: a Ctrl-C swallowed on the way is raised here
        if self.plain is not None and message != self.said:
            # a new phase at once; the same phase's next step ("layer 3 of 24") at most every 10 s
            key, last_key = message.split(":")[0], (self.said or "").split(":")[0]
            if key != last_key or time.monotonic() - self.plain.last >= 10.0:
                self.plain(message)
            self.said = message
        if self.bar is not None:
            new_phase = message != self.bar.tasks[0].description
            self.bar.update(self.task, description=message, completed=done or 0, total=total)
            if new_phase:  # draw every phase once: the timed refresh (10/s) skips the short ones
                self.bar.refresh()
