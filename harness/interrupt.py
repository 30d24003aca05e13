"""Ctrl-C that is never lost (issue 41).

Python raises KeyboardInterrupt wherever the main thread is when SIGINT lands. Where
that is a weakref callback or a finaliser -- a torch or numpy object collected in the
middle of a capture -- the exception is printed as "Exception ignored in ..." and
swallowed, and the command goes on as if nothing happened (CI: ``fuzz`` interrupted
40 s in ran to its 150 s budget). So the handler also remembers the signal, and the
boundaries between units of work (a fuzz example, a phase of a case) raise it again
when it was swallowed. Installed by ``cli.main`` in the main thread."""

from __future__ import annotations

import signal
import threading
import os
import sys

_pending = False


def _handler(signum, frame):
    global _pending
    _pending = True
    raise KeyboardInterrupt


def install() -> None:
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)


def check() -> None:
    """At a boundary between units of work: a Ctrl-C received and swallowed is raised here."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt


def finish(status: int) -> None:
    """From now on a SIGINT ends the process at once with ``status`` (the command is already
    on its way out: nothing is left to interrupt cleanly)."""

    def _now(signum, frame):
        try:
            sys.stderr.flush()
        finally:
            os._exit(status)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _now)


def delivered() -> None:
    """The interrupt reached the command's top (cli.main): nothing left to raise again."""
    global _pending
    _pending = False
