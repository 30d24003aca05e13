#!/usr/bin/env python3
"""Write ``lock.txt``: the exact version of every package the project installs.

    python scripts/lock.py                          # re-resolve, keeping every pin the lock has
    python scripts/lock.py --upgrade transformers   # let one package (and what it needs) move
    python scripts/lock.py --pin transformers==5.25.0
    python scripts/lock.py --check                  # exit 1 when lock.txt is not what this would write

The lock is a pip constraints file (``pip install -c lock.txt``), made by pip's
own resolver: ``pip install --dry-run --ignore-installed --report`` of the
project with every extra (docs/explanation/dependencies.md says why pip
constraints and not uv's lock or pip-tools). ``scripts/setup.sh`` installs
through it, so the README's two commands install exactly these versions on any
day; ``tests/test_lock.py`` fails when what is installed differs from it, and
``harness/versions.py`` reads it to say in every report whether a run was made
on the calibrated versions.

Re-locking keeps every package at its locked version unless ``--upgrade`` or
``--pin`` names it: a new release of a reference moves a verdict, so it enters
the lock on purpose (after ``conformance upstream`` says what it changes), never
as a side effect of re-locking something else.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "lock.txt"
# the extras locked with the core: every one pyproject.toml declares
HEADER = """\
# The lock: the exact version of every package the project installs, with every
# extra (a pip constraints file). scripts/setup.sh installs through it
# (pip install -c lock.txt); tests/test_lock.py fails when the environment differs
# from it; harness/versions.py reads it: a report made on other versions says so.
# The verdicts and the committed baselines were calibrated on these versions.
# Written by scripts/lock.py -- do not edit by hand; to move a reference:
#   python scripts/lock.py --upgrade transformers   (after `conformance upstream`)
"""
# not pinned: the installer's own tools, and the project itself
SKIP = {"pip", "attn-conformance"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """``{normalised name: version}`` of a lock file (empty when there is none)."""
    out = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, ver = line.partition("==")
        out[norm(name)] = ver.strip()
    return out


def extras() -> list[str]:
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {}))


def llamacpp_wheels() -> list[str]:
    """The folders holding the llama-cpp-python wheels scripts/build_llamacpp.sh built
    (its metadata is read from one, not from a source build)."""
    base = Path(os.environ.get("CONFORMANCE_WHEELS", Path.home() / ".cache" / "attn-conformance" / "wheels"))
    return [str(d) for d in sorted(base.glob("*")) if d.is_dir()] if base.is_dir() else []


def resolve(pins: dict[str, str], python: str) -> dict[str, str]:
    """pip's resolution of the project with every extra, under ``pins``."""
    with tempfile.TemporaryDirectory() as tmp:
        cons = Path(tmp) / "pins.txt"
        cons.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(report), "-c", str(cons),
               *[a for d in llamacpp_wheels() for a in ("--find-links", d)],
               "-e", f"{ROOT}[{','.join(extras())}]"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"lock.py: pip could not resolve the project under the lock (exit {r.returncode})")
        got = json.loads(report.read_text())["install"]
    out = {}
    for item in got:
        name, ver = norm(item["metadata"]["name"]), item["metadata"]["version"]
        if name in SKIP:
            continue
        out[name] = ver.split("+", 1)[0]  # torch 2.13.0+cpu: the local label is the build, not the release
    return out


def render(locked: dict[str, str]) -> str:
    return HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(locked.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upgrade", action="append", default=[], metavar="NAME",
                   help="let NAME move to the newest release the project allows (repeatable)")
    p.add_argument("--pin", action="append", default=[], metavar="NAME==VERSION", help="pin NAME (repeatable)")
    p.add_argument("--check", action="store_true", help="exit 1 when lock.txt differs from a fresh resolution")
    p.add_argument("--python", default=sys.executable, help="the interpreter whose pip resolves (default: this one)")
    a = p.parse_args(argv)
    old = read_lock()
    pins = dict(old)
    for n in a.upgrade:
        pins.pop(norm(n), None)
    for spec in a.pin:
        n, sep, v = spec.partition("==")
        if not sep or not v:
            print(f"lock.py: --pin {spec!r} is not NAME==VERSION", file=sys.stderr)
            return 2
        pins[norm(n)] = v
    new = resolve(pins, a.python)
    text = render(new)
    if a.check:
        if LOCK.is_file() and LOCK.read_text() == text:
            print("lock.txt is current")
            return 0
        print("lock.txt differs from a fresh resolution: run python scripts/lock.py", file=sys.stderr)
        return 1
    LOCK.write_text(text)
    moved = {n: (old.get(n), v) for n, v in new.items() if old.get(n) != v}
    gone = sorted(set(old) - set(new))
    for n, (o, v) in sorted(moved.items()):
        print(f"{n}: {o or '(new)'} -> {v}")
    for n in gone:
        print(f"{n}: {old[n]} -> (removed)")
    print(f"lock.txt: {len(new)} packages" + ("" if moved or gone else " (unchanged)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
