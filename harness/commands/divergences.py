"""``conformance divergences``: where HF and llama.cpp compute different models.

Every finding between two references (the policy's ``[[finding]]`` statements
whose candidate and reference are both references: fixtures/tolerance.toml and
each family folder's findings.toml) is listed with what a user needs to report
it upstream: the family, the setting it holds under, the bound it is excused
at, the largest NMSE a run measured for it (and how many rows), the source
lines its reason cites on each side, a command that reproduces it (a case of
the run where it was measured), and the reason in full.

Measured sizes come from a run directory (default: the committed baseline of
the default matrix, ``fixtures/baselines/default``); a finding no case of that
run reached says so -- it is written from another run (the long matrix, a
test).
"""

from __future__ import annotations

import re
from pathlib import Path
import sys

from ..errors import UsageError
from .triangulate import command_of
from harness.lazy import lazy
from .. import references
from ..policy import load_policy
from ..report import read_rows
from .triangulate import load_tables
from ..versions import read_lock
from . import triangulate

pd = lazy("pandas")

DEFAULT_RUN = Path(__file__).resolve().parents[2] / "fixtures" / "baselines" / "default"
# the source files a finding's reason cites, by side
_LC = re.compile(r"((?:src/models/|src/llama-|ggml/src/|conversion/|convert_hf_to_gguf)[\w./-]*(?:\s+\w+\(?\)?)?)")
_MLX = re.compile(r"(mlx_lm/models/[\w./-]*(?:\s+\w+(?:\.\w+)?)?)")
_HF = re.compile(r"((?:modeling_|configuration_)\w+\.py(?:\s+\w+(?:\.\w+)?)?|(?:HF|transformers') [A-Z]\w+(?:\.\w+)?)")


def register(sub) -> None:
    p = sub.add_parser("divergences", help="every disagreement between the references: family, setting, size, "
                                           "source lines and a command that reproduces it")
    p.add_argument("--run", metavar="DIR", help="the run whose rows give each finding's measured size and command "
                                                "(default fixtures/baselines/default)")
    p.add_argument("--family", action="append", help="only this family (repeatable)")
    p.add_argument("--md", metavar="FILE", help="also write the markdown to FILE")
    p.add_argument("--triangulate", metavar="WITNESS",
                   help="measure whom a third implementation follows on every HF-vs-llama.cpp finding the run "
                        "reached -- its worst case re-run with the witness: a reference (mlx) beside the pair, or "
                        "an engine (ort-gqa, openvino, ...) judged as the candidate against "
                        "each side -- and store the table (fixtures/triangulation/<witness>.json) that the page's "
                        "column reads")
    p.set_defaults(fn=cmd_divergences)


def _cond(f: dict) -> str:
    c = f.get("config") or {}
    out = []
    for k, v in c.items():
        if isinstance(v, dict):
            if "ne_key" in v:
                out.append(f"{k} != {v['ne_key']}")
            if "ne" in v:
                out.append(f"{k} != {v['ne']}")
            if "set" in v:
                out.append(f"{k} {'set' if v['set'] else 'unset'}")
            if "lt" in v:
                out.append(f"{k} < {v['lt']}")
        elif k.startswith("family.") and isinstance(v, bool):
            # a value the family reads from the config (Family.finding_values): its name says it
            name = k[len("family."):].replace("_", " ")
            out.append(name if v else f"not: {name}")
        else:
            out.append(f"{k} = {v}")
    if f.get("tokens_at_most_key"):
        out.append(f"a sequence no longer than {f['tokens_at_most_key']}")
    if f.get("tokens_at_most"):
        out.append(f"a sequence of at most {f['tokens_at_most']} tokens (the longest measured)")
    if f.get("layer_config"):
        out.append("the layers where " + ", ".join(f"{k}[layer] = {v}" for k, v in f["layer_config"].items()))
    if f.get("later_call_rows_at_least"):
        out.append(f"a call after a sequence's first carrying >= {f['later_call_rows_at_least']} rows (--schedule)")
    return ", ".join(out) or "always (the family's default config)"


def _bound(f: dict) -> str:
    names = {"max_nmse": "NMSE", "max_nmse_per_token": "NMSE per token", "max_nmse_per_layer": "NMSE per layer"}
    return ", ".join(f"{names[k]} {f[k]:g}" for k in names if k in f) or "unbounded"


def divergences(run_dir: Path, families: list[str] | None = None) -> str:
    refs = set(references.names())
    pol = load_policy()
    try:
        df = read_rows(Path(run_dir))
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    df = df[df["status"] == "finding"]
    stated = [f for f in pol.findings if f["candidate"] in refs and f["reference"] in refs]
    seen_by = {f["_n"].split(" (seen by")[0]: f for f in pol.findings if "(seen by" in f["_n"]}

    tables = load_tables()
    out = ["# Divergences between the references", "",
           f"Every place HF transformers and llama.cpp compute different models, as the policy's findings state "
           f"them (fixtures/tolerance.toml, harness/families/<name>/findings.toml), measured in "
           f"`{Path(run_dir).name}`. Each is something a user can report upstream: the setting, the size, the "
           "source lines on each side and a command that shows it.", "",
           "| finding | family | holds when | excused up to | measured (max NMSE, rows) | first at |"
           + "".join(f" {w} computes |" for w in tables),
           "|---|---|---|---|---|---|" + "---|" * len(tables)]
    if tables:
        out[-2:-2] = [_witness_note(tables), ""]
    sections = []
    for f in stated:
        fams = f["family"] if isinstance(f["family"], list) else [f["family"]]
        if families and not set(fams) & set(families):
            continue
        label = f["_n"]
        pat = re.escape(f"finding {label}:")
        mine = df[df["reason"].str.contains(pat, regex=True)]
        cand = seen_by.get(label)
        theirs = df[df["reason"].str.contains(re.escape(f"finding {cand['_n']}:"), regex=True)] if cand else df[:0]
        measured = (f"{pd.to_numeric(mine['nmse']).max():.3g} ({len(mine)})" if len(mine)
                    else "not reached in this run")
        first = f.get("downstream_of") or (", ".join(f.get("probes", [])[:3]) or "-")
        out.append(f"| `{label}` | {', '.join(fams)} | {_cond(f)} | {_bound(f)} | {measured} | {first} |"
                   + "".join(f" {_verdict(t, f, label)} |" for t in tables.values()))
        lc = sorted(set(m.strip() for m in _LC.findall(f["reason"])))
        lc = [x for x in lc if not x.startswith("src/models/") or f["candidate"] == "llamacpp"
              or "llamacpp" in (f["candidate"], f["reference"])]
        hf = sorted(set(m.strip() for m in _HF.findall(f["reason"])))
        dts = f" (comparison dtypes {', '.join(f['dtypes'])})" if f.get("dtypes") else ""
        sec = [f"## `{label}`: {', '.join(fams)}", "",
               f"- **holds when**: {_cond(f)}{dts}",
               f"- **excused up to**: {_bound(f)}, {f['candidate']} vs {f['reference']}"
               + (f", from {f['downstream_of']} on" if f.get("downstream_of") else ""),
               f"- **measured**: {measured}"]
        if cand:
            cm = (f"{pd.to_numeric(theirs['nmse']).max():.3g} ({len(theirs)} rows)" if len(theirs)
                  else "not reached in this run")
            sec.append(f"- **as {cand['candidate']} sees it** against {cand['reference']} (teacher-forced, at "
                       f"{', '.join(cand.get('probes', []))}): excused up to {_bound(cand)}; measured {cm}")
        sec.append(f"- **llama.cpp side**: {', '.join(f'`{x}`' for x in lc) or '(see the reason)'}")
        sec.append(f"- **HF side**: {', '.join(f'`{x}`' for x in hf) or '(see the reason)'}")
        mlx = sorted(set(m.strip() for m in _MLX.findall(f["reason"])))
        if mlx:
            sec.append(f"- **mlx-lm side**: {', '.join(f'`{x}`' for x in mlx)}")
        for w, t in tables.items():
            e = t["findings"].get(label)
            if e is not None:
                sides = "; ".join(f"{k[3:]} {v}" for k, v in e.items() if k.startswith("vs_"))
                sec.append(f"- **{w} computes**: {e['verdict']}" + (f" at {e['at']} ({sides})" if e.get("at") else "")
                           + (f": {e['why']}" if e.get("why") else "") + f"; `{e['case']}`")
        rows = mine if len(mine) else theirs
        if len(rows):
            worst = rows.loc[pd.to_numeric(rows["nmse"]).idxmax()]
            sec.append(f"- **reproduce**: `{command_of(worst)}` (worst at layer {worst['layer']} {worst['probe']})")
        else:
            sec.append("- **reproduce**: no case of this run reaches it; the reason says where it was measured")
        sec += ["", f["reason"], ""]
        sections.append("\n".join(sec))
    return "\n".join(out) + "\n\n" + "\n".join(sections)


def _verdict(table: dict, f: dict, label: str) -> str:
    if f["candidate"] != "llamacpp" or f["reference"] not in ("hf", "hf_cached"):
        return "-"
    e = table["findings"].get(label)
    if e:
        return e["verdict"]
    fams = f["family"] if isinstance(f["family"], list) else [f["family"]]
    # a table measured with --family holds nothing of the other families: unmeasured, not unreached
    return "not measured" if table.get("families") and not set(fams) & set(table["families"]) else "not reached"


def _witness_note(tables: dict) -> str:
    lock = read_lock()
    parts = []
    for w, t in tables.items():
        vs = t.get("versions", {})
        off = [f"{k} {v} (lock {lock.get(k)})" for k, v in vs.items() if lock.get(k) and lock.get(k) != v]
        fams = f" over {', '.join(t['families'])}" if t.get("families") else ""
        parts.append(f"`{w}`: measured{fams} on {', '.join(f'{k} {v}' for k, v in vs.items())}"
                     + (f" -- NOT the lock's: {', '.join(off)}" if off else ""))
    return ("A witness column says whom a third implementation follows where the pair disagrees, at the first "
            "probe the finding excused that the witness exposes, in the finding's worst case re-run with the "
            "witness (`conformance divergences --triangulate WITNESS`; harness/commands/triangulate.py): a "
            "reference (mlx) beside the pair, or an engine judged as the case's candidate against each side "
            "(`--candidate NAME --ref hf,llamacpp`), its distance to each side held to the bound the pair's own "
            "row there was judged by (a teacher-forced one, ort-gqa, only in the layer where the pair starts to "
            "differ). HF, llama.cpp, neither, both (the difference is below the bound there), not "
            "covered (the witness's refusal or error, or no such probe: why, in the section; for an engine its "
            "skip in its own words -- a family it does not convert, a KV mode or dtype it does not run), not "
            "reached (no case of the run reached the finding) or not measured (the table was measured over other "
            "families). " + "; ".join(parts) + ".")


def cmd_divergences(a) -> int:
    run = Path(a.run) if a.run else DEFAULT_RUN
    if not run.is_dir():
        raise UsageError(f"--run {run} is not a run directory")
    if a.triangulate:
        table = triangulate.measure(run, a.triangulate, a.family,
                                    progress=lambda m: print(f"triangulate: {m}", file=sys.stderr, flush=True))
        p = triangulate.write(table, a.family)
        print(f"triangulate: {len(table['findings'])} findings -> {p}", file=sys.stderr)
    text = divergences(run, a.family)
    if a.md:
        Path(a.md).write_text(text)
    print(text, end="")
    return 0
