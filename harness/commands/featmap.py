"""``conformance features``: which decoration is verified where.

Every decoration the spec names (``harness.features.SPEC_DECORATIONS``) x the
families whose cases exercise it x the references: the status of impl's
comparisons and the worst NMSE on ``attn_out``; a decoration no case exercises
is listed as unverified. From an existing run (``--run DIR``) or by running a
matrix spec (default fixtures/matrix/default.toml, reusing cached captures).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UsageError
from .matrix import add_run_args
from .. import matrix, report, views
from .matrix import DEFAULT_SPEC, plots_of, run_dir, say_default


def register(sub) -> None:
    p = sub.add_parser("features", help="decorations x families x references: verified where, worst attn_out NMSE")
    p.add_argument("spec", nargs="?", metavar="SPEC", help="matrix spec to run (default fixtures/matrix/default.toml)")
    p.add_argument("--run", metavar="DIR", help="read an existing run directory instead of running a spec")
    add_run_args(p)
    p.set_defaults(fn=cmd_features)


def cmd_features(a) -> int:
    if a.run:
        if a.spec:
            raise UsageError("give a SPEC to run or --run DIR to read, not both")
        if not Path(a.run).is_dir():
            raise UsageError(f"--run {a.run!r} is not a directory")
        try:
            df = report.read_rows(Path(a.run))
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
    else:
        if a.jobs < 1:
            raise UsageError(f"-j/--jobs must be at least 1, got {a.jobs}")
        spec = matrix.load_spec(a.spec or DEFAULT_SPEC)
        d = matrix.start(spec, a.out, None, a.policy, a.jobs, sys.argv[1:])
        say_default(a.spec, spec, "features")
        df = run_dir(d, a.jobs, plots_of(a))[1]
    print(views.feature_map(df))
    print(views.run_model(df, {}).last_line())
    return report.exit_status(df)
