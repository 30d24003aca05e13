"""Third-party chatter goes to the run's log, not into the tool's output.

What a run prints on stderr is the tool's own: its progress and its errors.
Everything else -- transformers' logging (kernel fall-back notices, config
remarks), Python warnings (numpy's RuntimeWarnings from a fully masked
softmax row, torch's), HF's progress bars -- is written to ``<run dir>/log.txt``
and, with ``-v``, to stderr as well. Until the run directory exists (``run``
makes it at the end, so bad input leaves nothing behind) the lines are held in
memory; matrix workers append to the same file.

Set up once per process: ``setup(verbose)`` in the parent, and in every worker
(``matrix._init_worker``), then ``attach(path)`` once the file may be written.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
import importlib.util

LOG_NAME = "log.txt"


class _Sink:
    def __init__(self):
        self.verbose = False
        self.path: str | None = None
        self.held: list[str] = []

    def write(self, text: str) -> None:
        if not text.endswith("\n"):
            text += "\n"
        if self.verbose:
            sys.stderr.write(text)
            sys.stderr.flush()
        if self.path is None:
            self.held.append(text)
            return
        # O_APPEND: the workers' lines interleave whole, never inside one another
        with open(self.path, "a") as f:
            f.write(text)


_SINK = _Sink()
_SET_UP = False


class _Handler(logging.Handler):
    def emit(self, record):
        try:
            _SINK.write(f"[{record.name}] {record.levelname.lower()}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 -- logging must never break the run
            self.handleError(record)


def _showwarning(message, category, filename, lineno, file=None, line=None):
    _SINK.write(f"[warning] {filename}:{lineno}: {category.__name__}: {message}")


def setup(verbose: bool = False) -> None:
    """Route third-party logging and warnings to the log (and stderr with ``verbose``)."""
    global _SET_UP
    _SINK.verbose = verbose
    if _SET_UP:
        return
    _SET_UP = True
    if not verbose:
        # read by huggingface_hub, and by transformers at import (its tqdm follows the hub's);
        # inherited by spawned workers
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.showwarning = _showwarning
    # transformers' logging is set up when transformers is first imported, not here: a
    # command refusing bad input never imports it (issue 29: 1-4 s of a bad --set's refusal)
    if "transformers.utils.logging" in sys.modules:
        _route_transformers(sys.modules["transformers.utils.logging"])
    else:
        sys.meta_path.insert(0, _AfterImport("transformers.utils.logging", _route_transformers))
    for name in ("huggingface_hub", "torch", "gguf"):
        lg = logging.getLogger(name)
        lg.addHandler(_Handler())
        lg.propagate = False


def _route_transformers(hf_logging) -> None:
    hf_logging.disable_default_handler()
    root = logging.getLogger("transformers")
    root.addHandler(_Handler())
    root.propagate = False
    if not _SINK.verbose:
        hf_logging.disable_progress_bar()
        try:
            from huggingface_hub.utils import disable_progress_bars  # absent from older huggingface_hub

            disable_progress_bars()
        except ImportError:
            pass


class _AfterImport:
    """A meta-path finder that runs ``then(module)`` once ``name`` has been imported
    (by whoever imports it first), then steps aside."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None

        sys.meta_path.remove(self)  # the real finders find it
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then(module)

        spec.loader.exec_module = exec_module
        return spec


def traceback_block(what: str, tb: str) -> None:
    """An exception's full traceback into the run's log (and stderr with ``-v``), under
    what raised it: an error row's reason is one line, this is where it broke (issue 41:
    an engine author's crash left no file or line anywhere)."""
    if tb:
        _SINK.write(f"---- traceback: {what}\n{tb.rstrip()}\n----")


def begin() -> None:
    """A new run in this process: hold its lines until its own log is attached (not in
    the previous run's file -- two runs in one process, as a test makes them); what was
    held so far is this run's too."""
    _SINK.path = None


def attach(path) -> None:
    """Write the log to ``path`` from now on (the lines held so far first)."""
    _SINK.path = str(path)
    held, _SINK.held = _SINK.held, []
    if held:
        with open(_SINK.path, "a") as f:
            f.writelines(held)


def log_path() -> str | None:
    return _SINK.path


def verbose() -> bool:
    return _SINK.verbose
