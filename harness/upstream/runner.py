"""What ``conformance upstream`` runs inside a release's environment:

    PYTHONPATH=TREE <env>/bin/python harness/upstream/runner.py SPEC IDS_FILE OUT_DIR JOBS

the cases of SPEC whose ids IDS_FILE lists (exactly those: the bisection runs only
the cases still in question), as ``conformance matrix`` runs them, into OUT_DIR,
and ``OUT_DIR/upstream.json``: the release it ran on, the cases whose family the
references' start-up checks refused (the message: an adapter the release broke), and the
source files each family reads in this release (``sources``: what the report
diffs between two releases).

Exit 0 when the run was made (whatever its verdict or refusals).

It is run as a file, with the harness it drives on PYTHONPATH: the working tree,
or another commit's (``conformance upstream --harness REV``, to replay what that
commit saw -- an adapter a release broke there), so it imports that harness by
absolute name and uses only what every commit since the matrix runner has.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import importlib.metadata as _md
import inspect
import sys as _sys

from harness.lazy import lazy
from harness import families, report

transformers = lazy("transformers")


def _own_entry_points_from_the_tree() -> None:
    """The installed metadata's entry points of this project are the installing
    checkout's (which may name a reference the tree being run lacks: mlx, for a commit
    before it); the tree's own pyproject.toml declares its plug-ins and every commit's
    plugins.py reads them from there. So the installed ones of this project are dropped
    here, before the tree's harness is imported (other distributions' plug-ins stay)."""
    def entry_points(**kw):
        seen, keep = set(), []
        for d in _md.distributions():  # the first of a name on sys.path, as importlib's own
            name = str(d.metadata["Name"] or "").replace("_", "-").lower()
            if name in seen:
                continue
            seen.add(name)
            keep += [ep for ep in d.entry_points if not (name == "attn-conformance"
                                                         and ep.group.startswith("attn_conformance."))]
        eps = _md.EntryPoints(keep)
        return eps.select(**kw) if kw else eps

    _md.entry_points = entry_points


_own_entry_points_from_the_tree()

from harness import matrix  # noqa: E402
from harness.errors import UsageError  # noqa: E402
from harness.versions import versions  # noqa: E402


def family_sources(family_name: str) -> dict[str, list[str]]:
    """``{package: [files]}`` the family reads in each reference installed here, as
    paths inside the package (``transformers/models/mamba/modeling_mamba.py``): the
    modeling module of its HF model class and its config class, and the modules of
    every transformers name the modeling module imports (``Cache`` ->
    ``cache_utils.py``; ``use_kernel_forward_from_hub`` -> ``integrations/hub_kernels.py``)."""

    fam = families.get(family_name)
    config = fam.make_config()
    out: list[str] = []
    try:
        cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        cls = None
    mods = [type(config).__module__] + ([cls.__module__] if cls is not None else [])
    seen = set()
    for modname in mods:
        mod = _sys.modules.get(modname)
        if mod is None:
            continue
        for m in [mod] + [_sys.modules.get(getattr(v, "__module__", "") or "") for v in vars(mod).values()
                          if not inspect.ismodule(v)]:
            name = getattr(m, "__name__", "")
            if not name.startswith("transformers") or name in seen or not getattr(m, "__file__", None):
                continue
            seen.add(name)
            rel = Path(m.__file__).resolve()
            root = Path(_sys.modules["transformers"].__file__).resolve().parent.parent
            try:
                out.append(str(rel.relative_to(root)))
            except ValueError:
                continue
    return {"transformers": sorted(out)}


def main(argv: list[str]) -> int:
    spec_path, ids_file, out, jobs = argv[0], Path(argv[1]), Path(argv[2]), int(argv[3])
    ids = [ln.strip() for ln in ids_file.read_text().splitlines() if ln.strip()]
    want = set(ids)
    # family by family, only the cases in question: an older release may lack another
    # family's model type altogether, and a family this release cannot configure is
    # refused (its cases' rows: the message) while the others run
    families_in = sorted({i.split("/", 1)[0] for i in ids})
    bad_family: dict[str, str] = {}
    cases = []
    spec = None
    for fam in families_in:
        try:
            try:
                part = matrix.load_spec(spec_path, keep=lambda c, f=fam: c.family == f and c.case_id() in want)
            except TypeError:  # a harness before load_spec(keep=): the whole spec, then the cases
                part = matrix.load_spec(spec_path)
                part = dataclasses.replace(part, cases=[c for c in part.cases if c.family == fam and c.case_id() in want])
        except UsageError as e:
            bad_family[fam] = str(e)
            continue
        spec = spec or part
        cases += part.cases
    if spec is None:
        spec = matrix.Spec(spec_path, "upstream", "", [])
    spec = dataclasses.replace(spec, cases=cases)
    info: dict = {"versions": versions(), "refused": None, "sources": {}}
    for fam in sorted({c.family for c in cases}):
        try:
            info["sources"][fam] = family_sources(fam)
        except Exception as e:  # noqa: BLE001 -- a family this release cannot even configure: its own row below
            info["sources"][fam] = {"error": f"{type(e).__name__}: {e}"}
    out.mkdir(parents=True, exist_ok=True)
    # each family's start-up check on its own: a release that moved one family's hook point
    # refuses that family (its cases' rows: the refusal), the others still run
    info["refused"] = {i: bad_family[i.split("/", 1)[0]] for i in ids if i.split("/", 1)[0] in bad_family}
    keep = []
    for fam in sorted({c.family for c in cases}):
        mine = [c for c in cases if c.family == fam]
        try:
            check = getattr(matrix, "preflight", None)  # a harness before the start-up checks has none
            if check is not None:
                check(mine)
            keep += mine
        except UsageError as e:
            info["refused"].update({c.case_id(): str(e) for c in mine})
    if keep:
        spec = dataclasses.replace(spec, cases=keep)
        d = matrix.start(spec, str(out / "run"), None, None, jobs, ["matrix", spec_path, "(upstream)"])
        matrix.complete(d, jobs, plots="none")

        getattr(report, "release_out", lambda d: None)(d)  # the lock matrix.start took (a harness with one)
    (out / "upstream.json").write_text(json.dumps(info, indent=1, default=str))
    return 0


if __name__ == "__main__":  # run as a file (search.py run_in_env), not imported
    sys.exit(main(sys.argv[1:]))
