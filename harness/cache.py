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
import time
import weakref
from pathlib import Path
import sys

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

    files = []
    for cls in type(family).__mro__:
        mod = sys.modules.get(cls.__module__)
        f = getattr(mod, "__file__", None)
        if f and cls.__module__.startswith("harness.") and Path(f) not in files:
            files.append(Path(f))
    # the generated table of what llama.cpp reads per arch (keys, the scales a graph passes
    # on): a data module, in no family's MRO, that shapes how a GGUF is read back (by
    # path: the cache imports no family module)
    files.append(Path(__file__).resolve().parent / "gguf" / "llamacpp_keys.py")
    return files


def load(kind: str, k: str) -> tuple[ProbeStore, dict] | None:
    """A stored capture as ``(probes, meta)``: the probes a ``ProbeStore`` read
    memory-mapped, one at a time (harness/store.py); None when there is none."""
    d = cache_dir() / kind / k
    if not (d / META).is_file():
        return None
    touch(d)
    st = ProbeStore(d)
    return st, st.meta


# ---------------------------------------------------------------- size, age, eviction
# The cache grows with every config, seed, length and release run (6.5 GB after a few
# days of use; issue 41). Each entry -- <kind>/<name>, a capture, a GGUF, a record, a
# release environment -- carries its last use as its mtime (``touch`` on every hit), so
# the least recently used go first when the cache passes its limit.
LIMIT_ENV = "CONFORMANCE_CACHE_LIMIT_GB"
DEFAULT_LIMIT_GB = 20.0
KEEP_KINDS = ("versions", "preflight")  # a few KB each, asked on every start: never evicted
CHECK_EVERY_S = 3600.0  # a walk of a full cache is seconds: at most once an hour after a command


def touch(path) -> None:
    """Mark a cache entry used now (its mtime: what eviction orders by)."""
    try:
        os.utime(path)
    except OSError:
        pass


def limit_bytes() -> int | None:
    """The cache's size limit (``CONFORMANCE_CACHE_LIMIT_GB``, default 20; 0: none)."""
    raw = os.environ.get(LIMIT_ENV, "")
    try:
        gb = float(raw) if raw.strip() else DEFAULT_LIMIT_GB
    except ValueError:
        gb = DEFAULT_LIMIT_GB
    return None if gb <= 0 else int(gb * 2**30)


def _size(p: Path) -> int:
    if p.is_symlink() or p.is_file():
        try:
            return p.lstat().st_size
        except OSError:
            return 0
    total = 0
    for root, _dirs, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def entries(root: Path | None = None) -> list[tuple[str, Path, int, float]]:
    """Every entry of the cache as ``(kind, path, bytes, last used)``, oldest use first."""
    root = Path(root) if root is not None else cache_root()
    out = []
    if not root.is_dir():
        return out
    for kind in sorted(p for p in root.iterdir() if p.is_dir()):
        for e in kind.iterdir():
            try:
                used = e.lstat().st_mtime
            except OSError:
                continue
            out.append((kind.name, e, _size(e), used))
    return sorted(out, key=lambda x: x[3])


def evict(root: Path | None = None, max_bytes: int | None = None, older_than_s: float | None = None,
          everything: bool = False, dry_run: bool = False) -> tuple[list, int]:
    """Remove entries: all (``everything``), those unused for ``older_than_s``, then the least
    recently used until the cache holds at most ``max_bytes``. ``(removed, bytes left)``."""
    now = time.time()
    es = entries(root)
    total = sum(e[2] for e in es)
    removed = []
    for kind, path, size, used in es:
        if kind in KEEP_KINDS and not everything:
            continue
        if not (everything or (older_than_s is not None and now - used > older_than_s)
                or (max_bytes is not None and total > max_bytes)):
            continue
        if not dry_run:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        removed.append((kind, path, size, used))
        total -= size
    return removed, total


def enforce_limit(force: bool = False) -> list:
    """Keep the cache under its limit, least recently used first; walked at most once an
    hour (``force``: now). Called as a command that used the cache ends."""
    lim = limit_bytes()
    root = cache_root()
    if lim is None or not root.is_dir():
        return []
    stamp = root / ".limit-checked"
    try:
        if not force and time.time() - stamp.stat().st_mtime < CHECK_EVERY_S:
            return []
    except OSError:
        pass
    try:
        stamp.touch()
    except OSError:
        return []
    return evict(root, max_bytes=lim)[0]


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
