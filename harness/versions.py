"""Versions of everything that shapes a result, and the project's git commit."""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("numpy", "torch", "transformers", "llama_cpp_python", "gguf", "array_api_compat", "pandas")


@lru_cache(maxsize=None)
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def versions() -> dict:
    v = {"python": platform.python_version()}
    for p in PACKAGES:
        v[p] = _version(p)
    v["llama_cpp_kernels"] = llama_cpp_kernels()
    v["git_commit"] = git_commit()
    return v


def cache_root() -> Path:
    """The cache directory (``CONFORMANCE_CACHE``, default .cache/conformance; harness/cache.py)."""
    import os

    return Path(os.environ.get("CONFORMANCE_CACHE", ROOT / ".cache" / "conformance"))


def _llama_cpp_stamp() -> list | None:
    """What decides ``llama_print_system_info`` without importing llama_cpp: the
    package's version, its shared libraries (name, size, mtime) and this CPU (its
    flags: a build with every CPU variant picks one at load), or None when it is
    not installed."""
    import hashlib
    from importlib.util import find_spec

    spec = find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    lib = Path(spec.origin).parent / "lib"
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lib.glob("*") if p.is_file()) \
        if lib.is_dir() else []
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return [_version("llama_cpp_python"), spec.origin, files, platform.machine(), platform.processor(),
            hashlib.sha256(flags.encode()).hexdigest()[:16]]


@lru_cache(maxsize=1)
def llama_cpp_kernels() -> str | None:
    """The ggml CPU kernels the installed llama.cpp was built with
    (``llama_print_system_info``: "SSE3 = 1 | AVX2 = 1 | F16C = 1 | ..."): they set
    the rounding of every llama.cpp result (scripts/build_llamacpp.sh), so they are
    recorded with every run and keyed into every llama.cpp capture. Kept in the
    cache under ``_llama_cpp_stamp`` (importing llama_cpp costs a warm run a tenth
    of a second; issue 29 finding 4): a rebuilt library or another CPU is another
    stamp, asked again."""
    import hashlib
    import json

    stamp = _llama_cpp_stamp()
    if stamp is None:
        return None
    f = cache_root() / "versions" / f"llama_cpp_kernels-{hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32]}.json"
    try:
        return json.loads(f.read_text())["kernels"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    got = _kernels_of_import()
    from .atomic import write_text

    try:
        write_text(f, json.dumps({"kernels": got, "stamp": stamp}))
    except OSError:  # a read-only cache: asked again next time
        pass
    return got


def _kernels_of_import() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    try:
        info = llama_cpp.llama_print_system_info()
        return (info.decode() if isinstance(info, bytes) else str(info)).strip()
    except Exception:  # an older binding without it: the version alone must do
        return None


def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
