"""Content-addressed cache of reference captures (and GGUF files).

A key hashes everything that shapes the stored result: the family, its full HF
config, the seed, the tokens, the dtype, the versions of the libraries that
computed it, and the source of the harness code that captured and mapped it --
so a second run recomputes only impl, and a changed probe map never reads a
stale capture.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .atomic import atomic_path
from .versions import ROOT


def cache_dir() -> Path:
    d = Path(os.environ.get("CONFORMANCE_CACHE", ROOT / ".cache" / "conformance"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def key(*parts) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def source_hash(*files) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:16]


def family_sources(family) -> list[Path]:
    """The source files a family's behaviour comes from: the module of every
    class in its MRO (a family module may build on a shared helper module, e.g.
    ``families/_mla.py``), so editing any of them invalidates its captures."""
    import sys

    files = []
    for cls in type(family).__mro__:
        mod = sys.modules.get(cls.__module__)
        f = getattr(mod, "__file__", None)
        if f and cls.__module__.startswith("harness.") and Path(f) not in files:
            files.append(Path(f))
    return files


def load(kind: str, k: str) -> tuple[dict, dict] | None:
    p = cache_dir() / kind / f"{k}.npz"
    if not p.exists():
        return None
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {n: z[n] for n in z.files if n != "__meta__"}
            meta = json.loads(bytes(z["__meta__"]).decode()) if "__meta__" in z.files else {}
        return arrays, meta
    except (OSError, ValueError):
        return None


def store(kind: str, k: str, arrays: dict, meta: dict | None = None) -> None:
    d = cache_dir() / kind
    d.mkdir(parents=True, exist_ok=True)
    payload = dict(arrays)
    payload["__meta__"] = np.frombuffer(json.dumps(meta or {}).encode(), dtype=np.uint8)
    # a name unique to this writer, renamed into place: parallel workers (and shards
    # sharing one cache directory) never read half a file or rename another's away
    with atomic_path(d / f"{k}.npz", suffix=".npz") as tmp:
        np.savez(tmp, **payload)
