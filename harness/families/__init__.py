"""The family registry: every module in this package that defines a ``FAMILY``
is a family. Discovered, not listed, so adding a family is adding one file."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from ..errors import UsageError, suggest
from .base import Family


@lru_cache(maxsize=1)
def registry() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_") or mod.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        fam = getattr(module, "FAMILY", None)
        if isinstance(fam, Family):
            found[fam.name] = fam
    return dict(sorted(found.items()))


def base_sources() -> list:
    """The files of the family machinery every family runs through (their content
    keys the reference captures, harness/cache.py)."""
    from pathlib import Path

    return [Path(__file__).with_name("base.py")]


def get(name: str) -> Family:
    reg = registry()
    if name not in reg:
        raise UsageError(f"unknown family {name!r}; {suggest(name, reg)}")
    return reg[name]
