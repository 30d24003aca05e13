"""Mutants: deliberate bugs in impl, one or more per decoration, applied at run
time without editing any file.

A mutant replaces ONE exact snippet of an impl module's source and re-executes
the module in place (``applied``); the original source is re-executed on exit.
The snippet must occur exactly once -- a refactor that moves it makes the
mutant STALE (an error), never a silent no-op that "survives".

Each mutant names the decoration it breaks (a feature tag), a case that
exercises that decoration, and the probe where it first acts (dataflow order),
so ``conformance mutate`` can report which probe killed it and ``conformance
bisect`` can be checked against it (tests/test_bisect.py); feature bisection
must name its decoration unless ``bisect_note`` says why it cannot
(tests/test_feature_bisect.py). Mutants live with the layer kind whose
decoration they break (``harness/kinds/<kind>/mutants``), each module exporting
``MUTANTS``; the registry collects them from every kind.
"""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from ..kinds.mutant import Mutant  # noqa: F401 (re-exported)
from .. import kinds


class StaleMutant(RuntimeError):
    pass


@contextmanager
def applied(m: Mutant, d: float | None = None):
    """Apply ``m`` for the duration of the block (a parametric mutant with its
    perturbation ``d``, default ``m.param``).

    The ONE function (or method) whose source holds the snippet is recompiled
    with the snippet replaced, in the module's own globals, and bound where the
    original was (the module attribute, or the class attribute for a method;
    every module that imported a top-level function by name is re-pointed too).
    Classes keep their identity, so objects built elsewhere stay valid."""
    mod = importlib.import_module(m.module)
    path = Path(mod.__file__)
    src = path.read_text()
    n = src.count(m.old)
    if n != 1:
        raise StaleMutant(f"mutant {m.name}: snippet occurs {n} times in {m.module} (must be exactly once)")
    owner, fname, node = _enclosing_def(src, src.index(m.old))
    lines = src.splitlines(keepends=True)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    seg = textwrap.dedent("".join(lines[first:node.end_lineno]))
    new_seg = seg.replace(textwrap.dedent(m.old) if m.old not in seg else m.old, m.text(d), 1)
    if new_seg == seg:
        raise StaleMutant(f"mutant {m.name}: could not place the snippet inside {fname}")
    ns: dict = {}
    exec(compile("\n" * first + new_seg, str(path), "exec"), mod.__dict__, ns)
    target = mod if owner is None else getattr(mod, owner)
    original = target.__dict__[fname] if owner is not None else getattr(mod, fname)
    replacement = ns[fname]
    setattr(target, fname, replacement)
    rebound = _rebind(original, replacement) if owner is None else []
    try:
        yield m
    finally:
        setattr(target, fname, original)
        for other, attr in rebound:
            setattr(other, attr, original)


def _enclosing_def(src: str, offset: int):
    """``(class_name or None, function_name, node)`` of the innermost def holding ``offset``."""
    tree = ast.parse(src)
    line = src.count("\n", 0, offset) + 1
    best = None
    for top in tree.body:
        cands = [(None, top)] if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(top, ast.ClassDef):
            cands += [(top.name, n) for n in top.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for owner, node in cands:
            if node.lineno <= line <= node.end_lineno:
                best = (owner, node.name, node)
    if best is None:
        raise StaleMutant(f"snippet at line {line} is not inside a function")
    return best


def _rebind(original, replacement) -> list:
    done = []
    for other in list(sys.modules.values()):
        d = getattr(other, "__dict__", None)
        if not d:
            continue
        for attr, val in list(d.items()):
            if val is original:
                setattr(other, attr, replacement)
                done.append((other, attr))
    return done


@lru_cache(maxsize=1)
def registry() -> dict[str, Mutant]:
    """Every layer kind's mutants (``LayerKind.mutant_modules``, each exporting ``MUTANTS``)."""
    found: dict[str, Mutant] = {}
    # once each: one plug-in may serve several kinds (harness/kinds/recurrent: every recurrent kind)
    modules = list(dict.fromkeys(m for k in kinds.registry().values() for m in k.mutant_modules))
    for name in modules:
        module = importlib.import_module(name)
        for m in getattr(module, "MUTANTS", ()):
            if m.name in found:
                raise ValueError(f"duplicate mutant name {m.name!r}")
            found[m.name] = m
    return found
