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


def llama_cpp_kernels() -> str | None:
    """The ggml CPU kernels the installed llama.cpp was built with
    (``llama_print_system_info``: "SSE3 = 1 | AVX2 = 1 | F16C = 1 | ..."): they set
    the rounding of every llama.cpp result (scripts/build_llamacpp.sh), so they are
    recorded with every run and keyed into every llama.cpp capture."""
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
