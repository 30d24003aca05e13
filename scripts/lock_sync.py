#!/usr/bin/env python3
"""Make this environment exactly the lock (lock.txt): uninstall what it does not list.

scripts/setup.sh runs it after ``pip install -c lock.txt``, which installs the
lock's versions but leaves alone what an earlier install put there -- a package a
newer reference brought (transformers 5.25's ``kernels``) would outlive the
downgrade and keep changing how HF's functions are called. pip's own tools, the
project itself and the chunks of a package the lock names are kept. Prints what it
removes; exit 1 when a locked package is installed at another version (pip was
told the lock: that is a broken install, said plainly).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.versions import installed, norm, read_lock  # noqa: E402

KEEP = {"pip", "setuptools", "wheel", "attn-conformance"}


def main() -> int:
    lock = read_lock()
    if not lock:
        print("lock_sync.py: no lock.txt", file=sys.stderr)
        return 2
    have = installed()
    extra = sorted(n for n in have if n not in lock and n not in KEEP)
    if extra:
        print(f"lock_sync.py: removing what lock.txt does not list: {', '.join(extra)}")
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", *extra], check=True)
    wrong = [f"{n} {have[n]} (lock: {lock[n]})" for n in sorted(have) if n in lock
             and have[n].split("+", 1)[0] != lock[n]]
    if wrong:
        print(f"lock_sync.py: installed at other versions than lock.txt: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
