"""What ``conformance list`` shows of each family, cheaply.

A family's feature tags are derived the way a case derives them
(``CaseRun.features``: from impl's layer configs AND the seeded weights, e.g.
``qkv_bias`` only where the model has the biases), which needs transformers,
torch and a built model -- seconds per family. So the tags of every family's
default config are computed once and kept in the cache, keyed by the source of
everything that decides them (the family modules, the feature derivation,
case.py, impl) and the versions of transformers and torch; ``list`` reads them
back without importing either.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import cache
from .versions import ROOT, _version
from .case import Case, CaseRun
from . import runlog

SCHEMA = 1


def _sources() -> list[Path]:
    h = ROOT / "harness"
    return sorted([*h.joinpath("families").glob("*.py"), h / "features.py", h / "case.py",
                   *ROOT.joinpath("impl").glob("*.py")])


def _key() -> str:
    return cache.key("list-features", SCHEMA, cache.source_hash(*_sources()), _version("transformers"),
                     _version("torch"))


def variants(fam) -> list:
    """A family's variants, the default first; ``[None]`` for a family without any."""
    return list(fam.variants) or [None]


def compute(fam, variant) -> list[str]:
    """The feature tags of ``fam``'s default config under ``variant``, as a case of it
    reports them (without the kv_* tag, which is the case's, not the family's)."""

    return [f for f in CaseRun(Case(family=fam.name, variant=variant), None).features if not f.startswith("kv_")]


def family_features(reg: dict, say=lambda msg: None) -> dict[str, dict[str, list[str]]]:
    """``{family: {variant or "": [tags]}}`` for every family in ``reg``, from the
    cache when it holds this source's tags, else computed (and stored)."""
    path = cache.cache_dir() / "list" / f"{_key()}.json"
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        held = {}
    missing = [(n, v) for n, fam in reg.items() for v in variants(fam) if (v or "") not in held.get(n, {})]
    if missing:
        say(f"deriving the features of {len(missing)} family configs (once; cached until the code changes) ...")

        runlog.setup(False)  # building the models is not the place for HF's remarks
        for n, v in missing:
            held.setdefault(n, {})[v or ""] = compute(reg[n], v)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(held, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: two `list`s at once never read half a file
    return held


def say_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
