"""What a long command shows while it works (issue 29, finding 3: a large `run`
printed nothing for 300 s).

On a terminal, a rich status line on stderr: the phase (building the model,
capturing a reference, the float64 oracle, judging layer i of n), a bar where
the phase counts something, and the time spent; it is cleared when the work
ends. Not on a terminal (CI logs, pipes) and with ``-q`` it shows nothing:
stdout keeps only what the command reports.
"""

from __future__ import annotations

import sys


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

    def __enter__(self):
        if self.live:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn)

            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
            self.bar = None

    def __call__(self, message: str, done: int | None = None, total: int | None = None) -> None:
        if self.bar is not None:
            new_phase = message != self.bar.tasks[0].description
            self.bar.update(self.task, description=message, completed=done or 0, total=total)
            if new_phase:  # draw every phase once: the timed refresh (10/s) skips the short ones
                self.bar.refresh()
