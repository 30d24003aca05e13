"""``conformance bisect``: to the first divergent layer and probe, to a feature, to a commit."""

from __future__ import annotations

import sys
from dataclasses import replace

from .. import references
from ..cli import _add_case_args
from ..bisect import describe, describe_features, feature_bisect, first_divergence, git_bisect
from ..case import CaseRun
from ..cli import case_from_args
from ..errors import UsageError
from ..policy import load_policy
from ..progress import Phases
from ..report import frame
from ..views import run_model


def register(sub) -> None:
    p = sub.add_parser("bisect", help="name the first divergence of a case (layer, probe), a feature, or a commit")
    _add_case_args(p)
    p.add_argument("--features", action="store_true",
                   help="also switch features off one at a time and in halves; print the smallest set that fixes it")
    p.add_argument("--git", nargs=2, metavar=("GOOD", "BAD"),
                   help="drive git bisect over the project's history with the case as the test")
    p.set_defaults(fn=cmd_bisect)


def cmd_bisect(a) -> int:
    policy = load_policy(a.policy)
    case = case_from_args(a)
    case.validate()
    if a.features and case.candidate.startswith("dump:"):
        raise UsageError("--features switches features off and reruns the case; a dump holds one run -- "
                         "bisect the engine's layers and probes without --features")
    if a.git:
        argv = _case_argv(sys.argv[2:] if len(sys.argv) > 2 else [], drop={"--git": 2, "--features": 0})
        try:
            res = git_bisect(a.git[0], a.git[1], argv)
        except RuntimeError as e:
            raise UsageError(str(e)) from None
        if res["first_bad"] is None:
            print(f"git bisect did not name a first bad commit ({res['runs']} runs)")
            return 1
        print(f"first bad commit: {res['subject']}  ({res['runs']} runs of the case)")
        return 0

    phases = Phases()
    run = CaseRun(case, policy, progress=phases)
    _ = run.layer_cfgs
    with phases:
        rows = run.rows()
    d = first_divergence(rows, candidate=run.candidate.name)
    if case.candidate != "impl":
        print(f"candidate: {run.candidate.name}")
    print(describe(d))
    for other in references.names()[1:]:  # each later reference, judged against the first
        r2r = first_divergence(rows, candidate=other)
        if r2r is not None:
            print("between the references: " + describe(r2r))
    if a.features and d is not None:
        print("feature bisection:")
        fcase = case
        if case.ref == "all" and d["reference"] in references.names():
            # bisect against the reference the first divergence is against (HF-only
            # module switches can then be used when that is HF)

            fcase = replace(case, ref=d["reference"])
            print(f"  (against {d['reference']}, where the first divergence is)")
        res = feature_bisect(fcase, policy, log=lambda m: print(m, file=sys.stderr))
        print(describe_features(res))

    print(run_model(frame(rows), {}).last_line())  # the case's verdict, as run would end
    return 0 if d is None else 1


def _case_argv(argv: list[str], drop: dict[str, int]) -> list[str]:
    """The case's own arguments, without the bisect-only options."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in drop:
            i += 1 + drop[argv[i]]
            continue
        out.append(argv[i])
        i += 1
    return out
