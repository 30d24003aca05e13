"""Candidates: the engines the harness judges (impl by default). The protocol
is in ``api`` (built on the contract's ``LayerCall`` / ``CandidateCapture`` /
``NotExposed``); the registry is here: the built-ins are declared as entry
points of the group ``attn_conformance.candidates`` in pyproject.toml, like any
user's, and ``dump:DIR`` names an engine that wrote a dump directory."""

from __future__ import annotations

from functools import lru_cache
import copy

from ..errors import UsageError, suggest
from .api import (  # noqa: F401
    DEFAULT,
    GROUP,
    PROBE_SHAPES,
    Candidate,
    CandidateCapture,
    LayerCall,
    LayerCandidate,
    NotExposed,
)
from .. import plugins, references
from .dump import DumpCandidate


@lru_cache(maxsize=1)
def registry() -> dict:
    """``{name: entry point}`` of the group (harness/plugins.py: installed entry points
    and this project's own declared ones). A name may not be a reference's: a
    row's candidate column must say which side was checked."""

    found = plugins.entry_points("candidates")
    for n in (*references.names(), "-"):
        found.pop(n, None)
    return found


DUMP_PREFIX = "dump:"


def names() -> list[str]:
    return list(registry())


def get(name: str) -> Candidate:
    """The candidate called ``name`` (``dump:DIR``: a dump directory's engine)."""
    return _get(name)


@lru_cache(maxsize=64)
def _get(name: str) -> Candidate:
    if name.startswith(DUMP_PREFIX):
        return DumpCandidate(name[len(DUMP_PREFIX):])
    reg = registry()
    if name not in reg:
        raise UsageError(f"unknown candidate {name!r}; {suggest(name, list(reg) + ['dump:DIR'])}")

    try:
        obj = plugins.load("candidates", name, reg[name])
    except plugins.PluginError as e:  # a plug-in that does not import is bad input, said in one line
        raise UsageError(str(e)) from None

    # a class is instantiated; an instance (one parametrised engine under several
    # names) is copied, so each name keeps its own
    cand = obj() if isinstance(obj, type) else copy.copy(obj)
    if not isinstance(cand, Candidate):
        raise UsageError(f"candidate {name!r} is a {type(cand).__name__}, not a harness.candidates.Candidate")
    cand.name = name
    return cand
