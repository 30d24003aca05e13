"""Writes that a concurrent reader sees whole or not at all.

Every file the harness writes where another process may look -- the capture
cache (HF / llama.cpp captures, GGUF exports, plots), shared by parallel
workers, by two matrices on one cache and by CI shards on one cache directory;
the run directory's rows, meta and views, read by `diff`, `merge` and
`--resume` after a kill -- is written under a temporary name UNIQUE to the
writer (mkstemp in the destination's own folder, so the rename stays on one
file system) and renamed into place with ``os.replace``, which POSIX makes
atomic. Two writers of one key each write their own temporary and the last
rename wins; both wrote the same content-addressed bytes, and a reader that
opened the first file keeps reading it.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_MODE = _file_mode()


@contextmanager
def atomic_path(dest: str | Path, suffix: str = ""):
    """Yield a fresh temporary path beside ``dest``; on a clean exit it is renamed
    onto ``dest``, on an exception it is removed (``dest`` is left as it was).
    ``suffix``: an ending the writer needs (``np.savez`` appends ``.npz`` to a name
    without it; matplotlib picks the format from it)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=f".tmp{suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _MODE)  # mkstemp makes 0600; the file is an ordinary one once in place
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(dest: str | Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text)


def write_bytes(dest: str | Path, data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
