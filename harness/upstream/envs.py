"""An environment per release of a reference, made once and kept in the cache.

``conformance upstream`` runs the same matrix on several releases of one
reference (transformers, llama-cpp-python). Each release gets a virtual
environment of its own under ``<cache>/envs/<dist>-<version>``, layered over the
project's environment: a ``.pth`` file adds the project's site-packages AFTER
the release's own, so the release -- and whatever it needs at other versions than
the lock (transformers 5.25's ``kernels``, a newer ``huggingface_hub``) -- is
imported from its environment, and everything else (torch, numpy, the harness
itself, the other reference) is the lock's, not installed again (torch alone is
700 MB). pip, run inside it, sees the project's packages as installed and adds
only what the release needs beside them.

The release is installed under the lock's constraints where they allow it (a
release that needs other versions of some package is resolved again with only
torch held, so pip never swaps the CPU torch for a CUDA build). What each
environment holds is written to its ``env.json``: the report names it.

llama-cpp-python's releases are source builds (scripts/build_llamacpp.sh: about
5 minutes on 2 cores; the wheel is kept per release and kernel set, so a second
bisection over the same releases builds nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..versions import ROOT, cache_root, norm, read_lock
from harness.lazy import lazy

packaging_version = lazy("packaging.version")

ENV_SCHEMA = 1


@dataclass(frozen=True)
class Index:
    """Where releases come from: the registry pip is configured with (default), or a
    folder of wheels only (``--find-links DIR``: a mirror, or a test's planted releases)."""

    find_links: str | None = None

    def pip_args(self) -> list[str]:
        return ["--no-index", "--find-links", self.find_links] if self.find_links else []


def env_root() -> Path:
    """Where the release environments are kept: ``CONFORMANCE_ENVS``, default
    ``<cache>/envs`` (a benchmark keeps them while it empties the capture cache)."""
    return Path(os.environ["CONFORMANCE_ENVS"]) if os.environ.get("CONFORMANCE_ENVS") else cache_root() / "envs"


def base_site() -> str:
    """This (the project's) environment's site-packages."""
    return sysconfig.get_paths()["purelib"]


def _pip(python: str | Path, *args, check=True, quiet=True) -> subprocess.CompletedProcess:
    cmd = [str(python), "-m", "pip", *args, "--disable-pip-version-check", *(["--quiet"] if quiet else [])]
    return subprocess.run(cmd, capture_output=True, text=True, check=False) if not check else _checked(cmd)


def _checked(cmd) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise EnvError(f"{' '.join(map(str, cmd[2:5]))} failed: {tail}")
    return r


class EnvError(RuntimeError):
    """An environment could not be made (a release pip cannot install, a build that failed)."""


def kernels_variant() -> str:
    """The ggml kernel set of the project's llama.cpp build (scripts/setup.sh writes it
    beside the environment), so another release is built with the same kernels."""
    marker = Path(sys.prefix) / "llamacpp-kernels"
    try:
        return marker.read_text().strip() or "avx2"
    except OSError:
        return os.environ.get("CONFORMANCE_LLAMACPP_KERNELS", "avx2")


def release_env(dist: str, version: str, index: Index = Index(), log=lambda s: None) -> Path:
    """The python of an environment holding ``dist==version`` over the project's own
    (made on first use, kept). Raises ``EnvError`` when the release cannot be installed."""
    dist = norm(dist)
    tag = "" if index.find_links is None else "-local"
    d = env_root() / f"{dist}-{version}{tag}"
    python = d / "bin" / "python"
    stamp = d / "env.json"
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("schema") == ENV_SCHEMA and python.exists():
                os.utime(d)  # its last use: the cache's limit evicts the least recently used
                return python
        except ValueError:
            pass
    if d.exists():
        shutil.rmtree(d)
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"making the environment of {dist} {version} ({tmp.parent})")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    site = Path(subprocess.run([str(tmp / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the project's packages after the release's own (site.addsitedir also runs their .pth
    # files: the project's editable install, the other extras); pip itself comes from there
    (site / "zz_conformance_base.pth").write_text(f"import site; site.addsitedir({base_site()!r})\n")
    tpython = tmp / "bin" / "python"
    if dist == "llama-cpp-python":
        _install_llamacpp(tpython, version, index, log)
    else:
        _install(tpython, dist, version, index, log)
    held = subprocess.run([str(tpython), "-m", "pip", "list", "--format", "json", "--path", str(site),
                           "--disable-pip-version-check"], capture_output=True, text=True)
    try:
        own = {norm(p["name"]): p["version"] for p in json.loads(held.stdout or "[]")}
    except ValueError:
        own = {}
    (tmp / "env.json").write_text(json.dumps({"schema": ENV_SCHEMA, "dist": dist, "version": version,
                                              "over": sys.prefix, "own_packages": own,
                                              "index": index.find_links or "registry"}, indent=1))
    os.replace(tmp, d) if not d.exists() else shutil.rmtree(tmp)
    # the venv's scripts name their own folder: the rename moved them; the python is a link
    return python


def _install(python: Path, dist: str, version: str, index: Index, log) -> None:
    lock = read_lock()
    cons = {n: v for n, v in lock.items() if n != dist}
    with _constraints(python.parent.parent, cons) as cfile:
        r = _pip(python, "install", "--no-compile", "-c", str(cfile), f"{dist}=={version}", *index.pip_args(), check=False)
        if r.returncode == 0:
            return
    # the release needs other versions than the lock's: resolved again with torch held
    log(f"{dist} {version} does not fit the lock; installing it with only torch held")
    with _constraints(python.parent.parent, {n: v for n, v in lock.items() if n == "torch"}) as cfile:
        r = _pip(python, "install", "--no-compile", "-c", str(cfile), f"{dist}=={version}", *index.pip_args(), check=False)
    if r.returncode != 0:
        tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-2:])
        raise EnvError(f"{dist} {version} cannot be installed: {tail}")


def _install_llamacpp(python: Path, version: str, index: Index, log) -> None:
    kernels = kernels_variant()
    log(f"building llama-cpp-python {version} ({kernels} kernels; about 5 minutes the first time)")
    env = dict(os.environ, LLAMACPP_VERSION=version, PYTHON=sys.executable)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build_llamacpp.sh"), kernels], capture_output=True,
                       text=True, env=env)
    if r.returncode != 0:
        tail = " ".join(r.stderr.strip().splitlines()[-3:])
        raise EnvError(f"llama-cpp-python {version} did not build: {tail}")
    whl = r.stdout.strip().splitlines()[-1]
    _pip(python, "install", "--no-deps", whl)


class _constraints:
    def __init__(self, d: Path, pins: dict):
        self.f = d / "constraints.txt"
        self.pins = pins

    def __enter__(self) -> Path:
        self.f.write_text("".join(f"{n}=={v}\n" for n, v in sorted(self.pins.items())))
        return self.f

    def __exit__(self, *exc) -> None:
        return None


def releases(dist: str, index: Index = Index(), pre: bool = False) -> list[str]:
    """Every release of ``dist`` the index holds, oldest first (``pip index versions``)."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", dist, "--disable-pip-version-check",
                        *(["--pre"] if pre else []), *index.pip_args()], capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("Available versions:")), None)
    if r.returncode != 0 or line is None:
        raise UsageError(f"no releases of {dist!r} found on {index.find_links or 'the package registry'}")
    out = []
    for v in line.partition(":")[2].split(","):
        try:
            out.append(packaging_version.Version(v.strip()))
        except packaging_version.InvalidVersion:
            continue
    return [str(v) for v in sorted(out)]
