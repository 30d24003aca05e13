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
import shutil
import weakref
from pathlib import Path

from .store import META, ProbeStore, StoreWriter
from .versions import cache_root


def cache_dir() -> Path:
    d = cache_root()
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
    # the generated table of what llama.cpp reads per arch (keys, the scales a graph passes
    # on): a data module, in no family's MRO, that shapes how a GGUF is read back (by
    # path: the cache imports no family module)
    files.append(Path(__file__).resolve().parent / "families" / "_llamacpp_keys.py")
    return files


def load(kind: str, k: str) -> tuple[ProbeStore, dict] | None:
    """A stored capture as ``(probes, meta)``: the probes a ``ProbeStore`` read
    memory-mapped, one at a time (harness/store.py); None when there is none."""
    d = cache_dir() / kind / k
    if not (d / META).is_file():
        return None
    st = ProbeStore(d)
    return st, st.meta


def writer(kind: str, k: str, keep=None) -> StoreWriter:
    """A capture written probe by probe as the reference computes it, under a
    temporary name beside its place in the cache (``commit`` moves it there whole;
    ``finish`` decides whether it stays)."""
    return StoreWriter(cache_dir() / kind / k, keep=keep)


def max_bytes() -> int:
    """The largest capture kept in the cache (``CONFORMANCE_CACHE_MAX_GB``, default
    2): a real-size capture (a 1B model's attention probabilities at 2048 tokens are
    8 GB per reference) is used by its run and then removed, not left to fill the
    disk."""
    try:
        return int(float(os.environ.get("CONFORMANCE_CACHE_MAX_GB", "2")) * 2**30)
    except ValueError:
        return 2 * 2**30


def finish(w: StoreWriter, meta: dict | None = None) -> ProbeStore:
    """Commit ``w``: into the cache when it is at most ``max_bytes()``, else into a
    scratch folder removed when the store is dropped (or the process ends)."""
    size = sum(f.stat().st_size for f in w.tmp.iterdir())
    if size <= max_bytes():
        return w.commit(meta)
    scratch = cache_dir() / "scratch" / f"{os.getpid()}-{w.dest.name}"
    scratch.parent.mkdir(parents=True, exist_ok=True)
    w.dest = scratch
    st = w.commit(dict(meta or {}, uncached=f"{size / 2**30:.1f} GB > the cache's {max_bytes() / 2**30:.1f} GB"))
    weakref.finalize(st, shutil.rmtree, str(scratch), True)
    return st


def store(kind: str, k: str, arrays: dict, meta: dict | None = None) -> ProbeStore:
    """Store ``arrays`` whole (a capture made in memory)."""
    with writer(kind, k) as w:
        w.update(arrays)
        return finish(w, meta)
