"""``conformance export-case`` and ``conformance judge``: a case for an engine
outside Python, and that engine's dump judged like any other candidate
(the format: harness/candidates/dump.py; README "Testing your own engine")."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..cli import _add_case_args, add_verbose
from ..progress import add_quiet
from ..candidates.dump import export_case
from ..case import CaseRun
from ..cli import case_from_args
from ..policy import load_policy
from ..report import remove_partial
from ..progress import Phases
from .run import cmd_run_case
from .. import references
from ..candidates.dump import FREE, read_manifest
from ..case import Case


def register(sub) -> None:
    p = sub.add_parser("export-case", help="write a case for an outside engine: config, weights (safetensors, "
                                           "GGUF), tokens, each reference's layer inputs")
    _add_case_args(p)
    p.add_argument("--out", metavar="DIR", required=True, help="the directory to write (must not exist or be empty)")

    add_verbose(p)  # HF's progress bars and warnings stay out of stderr (harness/runlog.py), as for run
    p.set_defaults(fn=cmd_export)
    j = sub.add_parser("judge", help="judge an engine's dump directory like any other candidate")
    j.add_argument("dump", metavar="DUMP_DIR", help="a dump: manifest.json + <run>/L{i}.safetensors")
    j.add_argument("--out", metavar="DIR", help="run directory (default reports/<run-id>)")
    j.add_argument("--policy", metavar="TOML", help="tolerance policy (default fixtures/tolerance.toml)")

    add_quiet(j)
    j.set_defaults(fn=cmd_judge)


def cmd_export(a) -> int:
    if a.candidate != "impl":
        raise UsageError("export-case writes the inputs of a case, whatever engine runs it; give no --candidate")
    out = Path(a.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty directory")
    case = case_from_args(a)
    case.validate()

    phases = Phases()
    run = CaseRun(case, load_policy(a.policy), progress=phases)
    _ = run.layer_cfgs
    try:
        with phases:
            data = export_case(run, out)
    except BaseException:
        remove_partial(out)  # nothing half-written is left behind
        raise
    print(f"case {data['case_id']}: {len(data['layers'])} layers, references {', '.join(data['references'])}")
    print(f"exported: {out} (case.json, hf/, layers.safetensors{', model.gguf' if 'gguf' in data['weights'] else ''}, "
          + ", ".join(r['inputs'] for r in data["references"].values()) + ")")
    return 0


def cmd_judge(a) -> int:
    return cmd_run_case(lambda: case_of(Path(a.dump)), a.policy, a.out, command="judge", quiet=a.quiet)


def case_of(d: Path):
    """The case a dump answers, its candidate being the dump (and its references
    the runs the dump holds)."""

    m = read_manifest(d)
    c = dict(m["case"])
    runs = [r for r in m["runs"] if r != FREE]
    # the dump's runs, each judged with the others: "all" where they are --ref all's, else named
    c["ref"] = c.get("ref", references.default()) if not runs else (
        "all" if set(runs) == set(references.all_names()) and len(runs) > 1 else ",".join(runs))
    c["candidate"] = f"dump:{Path(d)}"
    try:
        return Case.from_dict(c)
    except TypeError as e:
        raise UsageError(f"dump {d}: its case is not a case: {e}") from None
