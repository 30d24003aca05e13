"""Probes on disk: what a capture writes as it goes, read back one probe at a time.

A real-size capture does not fit in memory (issue 13): a 1B-class model at 2048
tokens has 32 heads x 2048 x 2048 attention probabilities per layer, 512 MB in
float32, sixteen layers of them per reference. So every reference writes each
probe to disk the moment it has it (``StoreWriter.put``) and a comparison reads
them back memory-mapped (``ProbeStore``), layer by layer: a run holds what one
layer needs on each side, beyond the weights.

A store is a directory: one ``<key>.npy`` per probe (keys like ``L3.q_rope``,
``logits``) and ``meta.json``. Arrays keep the precision they were computed in:
a float64 array whose every value is a float32 (a float32 reference's values
widened, llama.cpp's tensors placed into float64 arrays) is written as float32,
losslessly, which halves the disk and the page cache. A store is made under a
temporary name beside its destination and renamed into place whole
(``StoreWriter.commit``), so a concurrent reader sees all of it or none of it
(harness/atomic.py's rule for files, for a directory).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

META = "meta.json"


def _file(d: Path, key: str) -> Path:
    return d / f"{key}.npy"


def compact(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest float type that holds it exactly: float32 for a float64
    array of float32 values (checked, never assumed)."""
    a = np.asarray(a)
    if a.dtype == np.float64 and a.size:
        b = a.astype(np.float32)
        # compared block by block: one float64 copy of the whole probe beside it would
        # be the largest temporary of a capture (logits at vocab 262144: 0.5 GB a sequence)
        fa, fb = np.ascontiguousarray(a).reshape(-1), b.reshape(-1)
        with np.errstate(invalid="ignore"):
            for i in range(0, fa.size, _BLOCK):
                if not np.array_equal(fb[i:i + _BLOCK].astype(np.float64), fa[i:i + _BLOCK], equal_nan=True):
                    return a
        return b
    return a


_BLOCK = 1 << 22  # elements per block of compact's check


class ProbeStore(Mapping):
    """A finished store: ``store[key]`` is the probe, memory-mapped read-only (the
    pages are read when used and the kernel may drop them again)."""

    def __init__(self, path: str | Path, meta: dict | None = None):
        self.path = Path(path)
        self._keys = sorted(p.name[:-4] for p in self.path.glob("*.npy")) if self.path.is_dir() else []
        self.meta = meta if meta is not None else _read_meta(self.path)

    def __getitem__(self, key: str) -> np.ndarray:
        f = _file(self.path, key)
        if key not in self._keys and not f.exists():
            raise KeyError(key)
        return np.load(f, mmap_mode="r", allow_pickle=False)

    def __contains__(self, key) -> bool:
        return key in set(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def nbytes(self) -> int:
        return sum(_file(self.path, k).stat().st_size for k in self._keys)


def _read_meta(d: Path) -> dict:
    try:
        return json.loads((d / META).read_text())
    except (OSError, ValueError):
        return {}


class StoreWriter(Mapping):
    """A store being written: ``put`` writes one probe to disk at once (the caller
    drops its copy); reading back what was put works before ``commit`` (a probe
    derived from others: MLA's rope slices, llama.cpp's derived ``attn_out``).
    ``keep``: which keys to write (None: all); a key it refuses is dropped unread,
    so a ``--layers`` / ``--probes`` subset costs no disk."""

    def __init__(self, dest: str | Path, keep=None):
        self.dest = Path(dest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.dest.parent, prefix=f".{self.dest.name}.", suffix=".tmp"))
        self.keep = keep
        self._keys: list[str] = []

    def wants(self, key: str) -> bool:
        return self.keep is None or self.keep(key)

    def put(self, key: str, array) -> None:
        if not self.wants(key):
            return
        a = compact(array)
        np.save(_file(self.tmp, key), np.ascontiguousarray(a), allow_pickle=False)
        if key not in self._keys:
            self._keys.append(key)

    # a dict-like sink: ``writer[key] = array`` is ``put``
    __setitem__ = put

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._keys:
            raise KeyError(key)
        return np.load(_file(self.tmp, key), mmap_mode="r", allow_pickle=False)

    def __contains__(self, key) -> bool:
        return key in self._keys

    def __iter__(self):
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def update(self, other: Mapping) -> None:
        for k, v in other.items():
            self.put(k, v)

    def commit(self, meta: dict | None = None) -> ProbeStore:
        """Move the store into place whole. A store another writer finished first
        under the same (content-addressed) name wins; this one is removed."""
        (self.tmp / META).write_text(json.dumps(meta or {}, default=str))
        os.chmod(self.tmp, 0o755)
        try:
            os.rename(self.tmp, self.dest)
        except OSError:
            if not self.dest.is_dir():
                raise
            shutil.rmtree(self.tmp, ignore_errors=True)
        return ProbeStore(self.dest)

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            self.discard()
        return False


def stored(arrays: Mapping | None) -> bool:
    return isinstance(arrays, (ProbeStore, StoreWriter))
