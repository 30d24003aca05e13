"""The family registry.

A family is ONE folder (``harness/families/<name>/``): its module
(``__init__.py``, defining ``FAMILY``: the HF config mapping, the probe maps,
the GGUF export and import, its fuzz space), its ``findings.toml`` (where the
references compute different models for it, each bounded by its measured size;
harness/policy.py merges them), and its test (``test_<name>.py``). The
built-in folders are discovered, not listed (``discover``, declared as the
``builtin`` entry point of ``attn_conformance.families``); another package adds
its own families by entry point -- a ``Family`` instance, or a callable that
returns ``{name: Family}`` -- and a ``findings.toml`` beside the module that
defines it is read the same way.

The machinery every family shares is the underscored modules and ``base.py``
here (``Family`` is assembled from one mixin per concern; see base.py).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from functools import lru_cache
from pathlib import Path

from ..errors import UsageError, suggest
from .base import Family
from .. import plugins

GROUP = "families"


def discover() -> dict[str, Family]:
    """The built-in families: every folder of this package whose module defines ``FAMILY``."""
    found: dict[str, Family] = {}
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_") or mod.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        fam = getattr(module, "FAMILY", None)
        if isinstance(fam, Family):
            found[fam.name] = fam
    return found


@lru_cache(maxsize=1)
def registry() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for name, ep in plugins.entry_points(GROUP).items():
        obj = plugins.load(GROUP, name, ep)
        try:
            got = obj() if callable(obj) and not isinstance(obj, Family) else obj
        except Exception as e:  # a family module that does not import (a misspelt hook: hookspec.check)
            raise plugins.PluginError(f"family entry point {name!r} failed to load: {type(e).__name__}: "
                                      f"{' '.join(str(e).split())[:300]}") from None
        fams = got if isinstance(got, dict) else {getattr(got, "name", name): got}
        for fname, fam in fams.items():
            if not isinstance(fam, Family):
                raise plugins.PluginError(f"family entry point {name!r} gave a {type(fam).__name__} for "
                                          f"{fname!r}, not a harness.families.Family")
            found[fam.name] = fam
    return dict(sorted(found.items()))


def folder(fam: Family) -> Path:
    """The folder of the module that defines ``fam`` (its findings.toml and test live there)."""
    return Path(sys.modules[type(fam).__module__].__file__).resolve().parent


def base_sources() -> list:
    """The files of the family machinery every family runs through (their content
    keys the reference captures, harness/cache.py)."""
    return [Path(__file__).with_name("base.py")]


def get(name: str) -> Family:
    reg = registry()
    if name not in reg:
        raise UsageError(f"unknown family {name!r}; {suggest(name, reg)}")
    return reg[name]
