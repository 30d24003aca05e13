"""The source of a reference release, and the hunks between two releases.

transformers ships its Python source in the wheel, so a release's files are read
from its environment (envs.py) -- the modeling module a family runs is the file
HF executed. llama-cpp-python's wheel holds only the built library; its source
distribution carries llama.cpp itself (``vendor/llama.cpp/src/models/<arch>.cpp``,
``src/llama-model.cpp``, ggml's CPU ops), downloaded once per release
(``pip download --no-binary :all:``) and read from the tarball.
"""

from __future__ import annotations

import difflib
import subprocess
import sys
import tarfile
from pathlib import Path

from ..versions import cache_root

HUNK_LINES = 160  # per file, in a report: the rest is counted, and the command shows it whole


def site_of(python: Path) -> Path:
    r = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       capture_output=True, text=True, check=True)
    return Path(r.stdout.strip())


def read_installed(python: Path, rel: str) -> str | None:
    """File ``rel`` (``transformers/models/...``) as the environment of ``python`` imports
    it: its own site-packages first, then the project's (a release environment is layered
    over it: envs.py)."""
    code = ("import importlib.util, sys; spec = importlib.util.find_spec(sys.argv[1]); "
            "print(spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else '')")
    top = rel.split("/", 1)[0]
    r = subprocess.run([str(python), "-c", code, top], capture_output=True, text=True)
    base = r.stdout.strip()
    if not base:
        return None
    p = Path(base).parent / rel
    try:
        return p.read_text(errors="replace")
    except OSError:
        return None


def sdist(dist: str, version: str, find_links: str | None = None) -> Path | None:
    """The source distribution of ``dist==version`` (downloaded once into the cache)."""
    d = cache_root() / "upstream" / "sdists" / f"{dist}-{version}"
    have = sorted(d.glob("*.tar.gz")) if d.is_dir() else []
    if have:
        return have[0]
    d.mkdir(parents=True, exist_ok=True)
    idx = ["--no-index", "--find-links", find_links] if find_links else []
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
                        "--disable-pip-version-check", "-d", str(d), f"{dist}=={version}", *idx],
                       capture_output=True, text=True)
    have = sorted(d.glob("*.tar.gz"))
    return have[0] if r.returncode == 0 and have else None


def read_sdist(tarball: Path, rel: str) -> str | None:
    """File ``rel`` (a path inside the project, e.g. ``vendor/llama.cpp/src/models/mamba.cpp``)."""
    with tarfile.open(tarball) as t:
        for m in t.getmembers():
            if m.name.split("/", 1)[-1] == rel and m.isfile():
                f = t.extractfile(m)
                return None if f is None else f.read().decode(errors="replace")
    return None


def list_sdist(tarball: Path, under: str) -> list[str]:
    with tarfile.open(tarball) as t:
        return [m.name.split("/", 1)[-1] for m in t.getmembers()
                if m.isfile() and m.name.split("/", 1)[-1].startswith(under)]


def hunks(old: str | None, new: str | None, rel: str, a: str, b: str, limit: int = HUNK_LINES) -> tuple[str, int]:
    """The unified diff of one file between releases ``a`` and ``b`` (at most ``limit``
    lines; how many lines it has in all). A file one release lacks diffs against nothing."""
    lines = list(difflib.unified_diff((old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
                                      fromfile=f"{a}/{rel}" if old is not None else "/dev/null",
                                      tofile=f"{b}/{rel}" if new is not None else "/dev/null", n=2))
    text = "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines[:limit])
    return text, len(lines)
