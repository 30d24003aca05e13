"""Versions of everything that shapes a result, and the project's git commit."""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
import re
import sysconfig
import os
import hashlib
from importlib.util import find_spec
import json

from .atomic import write_text

ROOT = Path(__file__).resolve().parent.parent
# every package that shapes a result, recorded with every run (meta.json) and checked
# against the lock: the references and what they compute with (tokenizers, safetensors,
# huggingface_hub read a checkpoint; kernels reroutes transformers' functions when it is
# installed: references/hf/internals.py), the array libraries impl and the oracle use,
# and the judged engines (the `engines` extra)
# the judged engines' packages (the `engines` extra): they shape only the rows of a candidate
# that runs on them, so a run without one installed says nothing about them
ENGINE_PACKAGES = ("onnxruntime", "onnx", "onnxruntime_genai", "openvino", "ctranslate2")
PACKAGES = ("numpy", "torch", "transformers", "llama_cpp_python", "gguf", "array_api_compat", "pandas",
            "tokenizers", "safetensors", "huggingface_hub", "kernels", *ENGINE_PACKAGES, "mlx_lm", "mlx")
# the references' own packages: a run on another release of one of these is named in
# every report's header (``drift``), and `conformance upstream` can bisect their releases
REFERENCE_PACKAGES = ("transformers", "llama_cpp_python", "mlx_lm")
LOCK = ROOT / "lock.txt"


def norm(name: str) -> str:
    """A distribution's normalised name (PEP 503): ``llama_cpp_python`` -> ``llama-cpp-python``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """``{normalised name: version}`` of the lock (scripts/lock.py writes it; empty when
    there is none, e.g. an installed copy of the harness without its checkout)."""
    out = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            out[norm(name)] = ver.strip()
    return out


def installed() -> dict[str, str]:
    """``{normalised name: version}`` of what is installed in this environment's own
    site-packages -- not of everything on ``sys.path``: importing setuptools (>= 71)
    appends its ``_vendor`` folder, whose bundled copies (jaraco.*, zipp, tomli, ...)
    are no install, and a test or a user may put a scratch target on the path (CI saw
    both turn the lock check red, depending on which test ran first in the worker)."""

    roots = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    return {norm(d.metadata["Name"]): d.version for d in metadata.distributions(path=roots) if d.metadata["Name"]}


@lru_cache(maxsize=1)
def calibrated() -> dict[str, str | None]:
    """The versions the verdicts were calibrated on: the lock's, for ``PACKAGES``."""
    lock = read_lock()
    return {p: lock.get(norm(p)) for p in PACKAGES}


def _base(v: str | None) -> str | None:
    return None if v is None else v.split("+", 1)[0]


def drift(v: dict | None = None) -> list[tuple[str, str | None, str | None]]:
    """``(package, installed, calibrated)`` for each package of ``PACKAGES`` whose
    installed version (``v``: a run's recorded versions; default this process's) is not
    the lock's -- a newer or older release, or one installed that the lock leaves out
    (``kernels`` beside transformers 5.25). Empty: the calibrated versions. A package
    not installed is no drift (an extra this run does not use)."""
    v = versions() if v is None else v
    cal = calibrated()
    if not any(cal.values()):
        return []  # no lock to compare with
    out = []
    for p in PACKAGES:
        have, want = _base(v.get(p)), cal.get(p)
        if have is not None and have != want:  # an extra not installed is not drift
            out.append((p, have, want))
    return out


def drift_line(v: dict | None = None) -> str:
    """One sentence for a report's header: the calibrated versions, or which are not."""
    d = drift(v)
    if not d:
        return "calibrated versions (lock.txt)"
    parts = [f"{p} {have or 'not installed'} (calibrated: {want or 'not installed'})" for p, have, want in d]
    return "NOT the calibrated versions: " + ", ".join(parts)


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
    return Path(os.environ.get("CONFORMANCE_CACHE", ROOT / ".cache" / "conformance"))


def _llama_cpp_stamp() -> list | None:
    """What decides ``llama_print_system_info`` without importing llama_cpp: the
    package's version, its shared libraries (name, size, mtime) and this CPU (its
    flags: a build with every CPU variant picks one at load), or None when it is
    not installed."""

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
    return per_llama_build("llama_cpp_kernels", None, _kernels_of_import)


def per_llama_build(name: str, extra, compute):
    """``compute()`` (JSON data) kept in the cache per llama.cpp build: under the
    library's stamp (``_llama_cpp_stamp``: version, its shared libraries, this CPU) and
    ``extra`` (what else it depends on); None when llama_cpp is not installed."""

    stamp = _llama_cpp_stamp()
    if stamp is None:
        return None
    f = cache_root() / "versions" / f"{name}-{hashlib.sha256(json.dumps([stamp, extra]).encode()).hexdigest()[:32]}.json"
    try:
        return json.loads(f.read_text())["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    got = compute()

    try:
        write_text(f, json.dumps({"value": got, "stamp": stamp}))
    except OSError:  # a read-only cache: computed again next time
        pass
    return got


def _kernels_of_import() -> str | None:
    try:
        import llama_cpp  # an optional extra ([llamacpp]): None without it
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
