"""The lock (lock.txt): setup installs exactly it, and this environment is it.

On 2026-12-06 a fresh install picked up transformers 5.25.0, released after the
last landing, and 63 default cases broke: the project asked only for
``transformers>=5.0,<6``. The README's two commands now install through the
lock (scripts/setup.sh: ``pip install -c lock.txt``, then scripts/lock_sync.py),
and these tests fail when what is installed is not what the lock says -- a
package outside it, or a locked one at another version.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from harness.versions import PACKAGES, calibrated, drift, drift_line, installed, norm, read_lock

ROOT = Path(__file__).resolve().parent.parent
KEEP = {"pip", "setuptools", "wheel", "attn-conformance"}


def test_the_lock_exists_and_pins_every_reference_exactly():
    lock = read_lock()
    assert lock, "lock.txt is missing or empty (scripts/lock.py writes it)"
    for name in ("transformers", "torch", "numpy", "gguf", "llama-cpp-python", "tokenizers", "safetensors",
                 "huggingface-hub", "array-api-compat", "pandas"):
        assert re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", lock.get(name, "")), f"{name} is not pinned in lock.txt"


def test_every_installed_package_is_the_locks():
    """What setup installed is exactly in the lock: nothing outside it, nothing at
    another version (torch's local label, +cpu, is the build, not the release)."""
    lock, have = read_lock(), installed()
    outside = sorted(n for n in have if n not in lock and n not in KEEP)
    wrong = sorted(f"{n} {v} (lock {lock[n]})" for n, v in have.items() if n in lock and v.split("+")[0] != lock[n])
    assert not outside, f"installed but not in lock.txt: {outside} (scripts/setup.sh installs -c lock.txt)"
    assert not wrong, f"installed at another version than lock.txt: {wrong}"


def test_the_lock_covers_every_requirement_of_every_extra():
    """A dependency added to pyproject.toml without re-locking would install unpinned."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"]) + [r for extra in proj["optional-dependencies"].values() for r in extra]
    lock = read_lock()
    missing = sorted({norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in reqs} - set(lock))
    assert not missing, f"pyproject.toml requires {missing}, which lock.txt does not pin: run scripts/lock.py"


def test_setup_installs_through_the_lock_and_nothing_beside_it():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    installs = [ln for ln in setup.splitlines() if "pip install" in ln and not ln.lstrip().startswith("#")]
    assert installs
    for ln in installs:
        assert "-c lock.txt" in ln or "--no-deps" in ln, f"scripts/setup.sh installs outside the lock: {ln.strip()}"
    assert "lock_sync.py" in setup
    # the llama.cpp build takes its release from the lock
    assert "lock.txt" in (ROOT / "scripts" / "build_llamacpp.sh").read_text()


def test_lock_sync_removes_what_the_lock_does_not_list(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock_sync", ROOT / "scripts" / "lock_sync.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls = []
    monkeypatch.setattr(mod, "installed", lambda: {**read_lock(), "kernels": "0.19.1", "pip": "26.0"})
    monkeypatch.setattr(mod.subprocess, "run", lambda cmd, check: calls.append(cmd))
    assert mod.main() == 0
    assert calls and calls[0][-1] == "kernels" and "pip" not in calls[0][4:]


def test_the_committed_baseline_was_made_on_the_lock():
    """The baseline's recorded versions are the lock's: a re-lock that moves a result
    must come with a new baseline (and the baseline, with the lock that made it)."""
    import json

    meta = json.loads((ROOT / "fixtures" / "baselines" / "default" / "meta.json").read_text())
    v = meta["versions"]
    cal = calibrated()
    differ = {p: (v[p], cal.get(p)) for p in PACKAGES if p in v and v[p] is not None and cal.get(p) is not None
              and v[p].split("+")[0] != cal[p]}
    assert not differ, f"the baseline was made on other versions than lock.txt: {differ}"


def test_drift_names_what_is_not_the_locks():
    cal = calibrated()
    v = {p: cal[p] for p in PACKAGES if cal.get(p)}
    assert drift(v) == [] and drift_line(v).startswith("calibrated versions")
    newer = dict(v, transformers="99.0.0")
    assert drift(newer) == [("transformers", "99.0.0", cal["transformers"])]
    assert f"NOT the calibrated versions: transformers 99.0.0 (calibrated: {cal['transformers']})" in drift_line(newer)
    # a package the lock leaves out (transformers 5.25's kernels) is drift; an extra not installed is not
    extra = {k: x for k, x in dict(v, kernels="0.19.1").items() if k != "openvino"}
    assert drift(extra) == [("kernels", "0.19.1", None)]


def test_installed_is_this_environment_not_everything_on_the_path(tmp_path, monkeypatch):
    """CI went red when a worker had imported setuptools (its _vendor folder joins
    sys.path) or put the tiny engine's scratch target on the path: neither is an install."""
    import setuptools  # noqa: F401  (>= 71 appends setuptools/_vendor to sys.path)

    dist = tmp_path / "scratch_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: scratch-pkg\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    everything = {norm(d.metadata["Name"]) for d in metadata.distributions()}
    assert "scratch-pkg" in everything  # the path does carry both ...
    assert any("setuptools" in p and p.endswith("_vendor") for p in __import__("sys").path)
    have = installed()
    assert "scratch-pkg" not in have and "jaraco-text" not in have  # ... and neither is counted
    assert {"torch", "transformers", "numpy"} <= set(have)
