"""The five extension points, declared the same way: entry points.

=============================  ==================================================
group                          what an entry point names
=============================  ==================================================
``attn_conformance.references`` a ``harness.references.Reference`` (hf, llamacpp)
``attn_conformance.kinds``      a ``harness.kinds.LayerKind`` (attention, mla, ...)
``attn_conformance.families``   a ``harness.families.Family``, or a callable that
                                returns ``{name: Family}`` (the built-in folders)
``attn_conformance.candidates`` a ``harness.candidates.Candidate`` (class or instance)
``attn_conformance.commands``   a command module: ``add_parser(sub)`` and ``run(args)``
=============================  ==================================================

A user's package adds its own under the same groups in its ``pyproject.toml``;
this project declares its built-ins there too, and reads them from its own
``pyproject.toml`` beside the installed metadata, so a checkout whose editable
install predates a new built-in still finds it (one declaration, one place).
"""

from __future__ import annotations

import importlib
from importlib import metadata
import sys
from functools import lru_cache
from pathlib import Path
import tomllib

PREFIX = "attn_conformance."
GROUPS = ("references", "kinds", "families", "candidates", "commands")


class Declared:
    """An entry point, ``module:attr`` (read from pyproject.toml or the metadata)."""
    def __init__(self, name: str, value: str):
        self.name, self.value = name, value

    def load(self):
        mod, _, attr = self.value.partition(":")
        obj = importlib.import_module(mod)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj


@lru_cache(maxsize=4)
def _installed(path: tuple):
    """Every installed distribution's entry points (``.select(group=...)``), read once
    per ``sys.path`` (``path``: where distributions are found; a test that prepends a
    plug-in's folder reads again): each ``entry_points(group=...)`` reads every
    distribution's metadata again (six groups: a tenth of a warm run, issue 29 finding 4)."""
    return metadata.entry_points()


@lru_cache(maxsize=None)
def _pyproject() -> dict:
    p = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        return tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _dist_name(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return None if name is None else name.replace("_", "-").lower()


def declared_here(group: str) -> dict[str, str]:
    """This project's own entry points of ``group`` as its pyproject.toml declares them."""
    return dict(_pyproject().get("project", {}).get("entry-points", {}).get(PREFIX + group, {}))


def entry_points(group: str, sort: bool = True) -> dict:
    """``{name: entry point}`` of ``group``: installed ones, overridden for their
    names by this checkout's own declarations (``sort``: by name; else this
    project's in the order pyproject.toml declares them, then the others')."""
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; valid: {', '.join(GROUPS)}")
    mine = {n: Declared(n, v) for n, v in declared_here(group).items()}
    # this project's own entry points come from this checkout's pyproject.toml alone: an
    # installed copy's metadata may be another checkout's (an editable install made from a
    # newer tree, whose `mlx` reference this tree lacks: `conformance upstream --harness REV`
    # runs an older tree over the installed metadata); other distributions' plug-ins stay
    own = _pyproject().get("project", {}).get("name") if mine or _pyproject() else None
    found = {ep.name: ep for ep in _installed(tuple(sys.path)).select(group=PREFIX + group)
             if not (own and _dist_name(ep) == own)}
    if not sort:
        return {**mine, **{n: ep for n, ep in found.items() if n not in mine}}
    found.update(mine)
    return dict(sorted(found.items()))


def load(group: str, name: str, ep=None):
    """The object entry point ``name`` of ``group`` names; a plug-in that does not
    import is a ``PluginError`` naming it (the caller makes it bad input)."""
    ep = ep if ep is not None else entry_points(group)[name]
    try:
        return ep.load()
    except Exception as e:
        raise PluginError(f"{_singular(group)} {name!r} ({getattr(ep, 'value', '?')}) failed to load: "
                          f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from None


def _singular(group: str) -> str:
    return "family" if group == "families" else group[:-1]


class PluginError(RuntimeError):
    """A plug-in that cannot be loaded (one line, names it and why)."""
