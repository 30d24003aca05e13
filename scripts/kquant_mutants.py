"""The mutants a matrix spec's cases can judge: every mutant whose decoration
(a feature tag) some case of the spec exercises, and the core ones (mask,
positions, default scale, residual: every case exercises them).

    python scripts/kquant_mutants.py [SPEC]   (default fixtures/matrix/kquant.toml)

prints them comma-separated, for ``conformance mutate SPEC --mutants``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.case import CaseRun  # noqa: E402
from harness.matrix import load_spec  # noqa: E402
from harness.mutants import registry  # noqa: E402
from harness.policy import load_policy  # noqa: E402


def main(spec: str) -> int:
    policy = load_policy()
    features = set()
    for case in load_spec(spec).cases:
        features |= set(CaseRun(case, policy).features)
    names = [m.name for m in registry().values() if m.core or m.decoration in features]
    print(",".join(sorted(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "fixtures" / "matrix" / "kquant.toml")))
