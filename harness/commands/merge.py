"""``conformance merge DIR...``: join the shards of one spec into one run
directory, the same report an unsharded run makes."""

from __future__ import annotations

import sys

from .. import matrix, report
from ..views import run_model


def register(sub) -> None:
    p = sub.add_parser("merge", help="join `conformance matrix --shard I/N` run directories into one report")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="the shards' run directories (all N of them)")
    p.add_argument("--out", metavar="DIR", help="merged run directory (default reports/<run-id>)")
    p.set_defaults(fn=cmd_merge)


def cmd_merge(a) -> int:
    d, df, _ = matrix.merge(a.dirs, a.out, sys.argv[1:])
    print(", ".join(f"{k} {v}" for k, v in sorted(report.counts(df).items())) or "no rows")
    print(f"report: {d}")

    print(run_model(df, {}).last_line())
    return report.exit_status(df)
