"""Whom a third implementation follows where HF and llama.cpp disagree (issue 38).

For every finding between HF (or HF's cached path) and llama.cpp that a run
reached, the case that measured it worst is run again with a witness: a third
reference beside the pair (``--ref hf,llamacpp,mlx``), or an engine nobody here
wrote judged as the case's candidate against each side (``--candidate openvino
--ref hf,llamacpp``: the candidates that declare ``engine_packages``). Either
way the re-run holds rows of the witness against each side, and those are all
the rule reads. At the first probe the finding excused in that re-run (dataflow
order: where the two start to differ) that the witness exposes, the witness is
compared with each side by the same rule a reference pair is judged by (the
policy's bound): it agrees with the side it passes against. A reference's rows
there are that rule's; an engine's are the candidate rule's (through HF's
float64 oracle), so its distance to each side is held to the bound the pair's
own row there was judged by (``Witness.statuses``). A teacher-forced
engine (ort-gqa) is fed each side's own input to every layer, so only the layer
where the pair starts to differ can say whom it computes like: past it, it is
fed two different inputs. The verdicts:

- ``HF`` / ``llama.cpp``: it passes against that side and not the other;
- ``neither``: it fails against both (a divergence of its own: the page says so);
- ``both``: it passes against both (the pair's difference is below the bound at
  that probe in this case: nothing to take sides on);
- ``not covered``: it does not implement the family or setting (its refusal: a
  reference's ``not-implemented``, an engine's ``skipped`` in its own words),
  or failed (its error), or exposes none of the probes the finding excused.

``conformance divergences --triangulate WITNESS`` measures and writes the table
(``fixtures/triangulation/<witness>.json``, with the versions it was measured
on, and the families it was measured over where ``--family`` narrowed a new
table); ``conformance divergences`` reads it into a column per witness. A table
measured on other versions than the lock's says so on the page.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, replace
from pathlib import Path
from importlib.metadata import PackageNotFoundError, requires, version

from ..errors import UsageError
from harness.lazy import lazy
from .. import candidates, references
from ..case import Case
from ..cli import parse_value
from contract.probes import LAYER_PROBES
from .. import case as case_module  # looked up at each call, as a test's patch of the module expects
from ..policy import load_policy
from ..report import read_rows

packaging_requirements = lazy("packaging.requirements")
pd = lazy("pandas")

TABLES = Path(__file__).resolve().parents[2] / "fixtures" / "triangulation"
PAIR_SIDES = ("hf", "hf_cached", "llamacpp")  # the references a finding's pair is drawn from
NAMES = {"hf": "HF", "hf_cached": "HF (cached)", "llamacpp": "llama.cpp"}
PAIR_PACKAGES = ("transformers", "llama-cpp-python")  # what the pair's side of every verdict ran


@dataclass(frozen=True)
class Witness:
    """What the re-run makes of a witness: the one difference between a third reference and
    an engine, so that both go through one ``measure``."""

    name: str
    # judged as the case's candidate against each side (an engine); else run as a reference
    # beside the pair. Either way its rows against each side have it as ``candidate`` (a
    # later reference is judged against the earlier ones), which is what ``_first`` reads
    candidate: bool
    # fed each side's own input to every layer (``Candidate.teacher_forced``); a reference
    # runs free from the tokens
    teacher_forced: bool
    packages: tuple  # its own distributions, whose releases the table records

    def refs(self, f: dict) -> str:
        """The re-run's ``--ref``: the finding's pair, and the witness beside it if a reference."""
        return ",".join((f["reference"], f["candidate"]) + (() if self.candidate else (self.name,)))

    def statuses(self, a, b, pair) -> tuple[str, str]:
        """Its status against each side at the probe (rows ``a``, ``b``), by the rule the pair's
        own row there (``pair``) was judged by. A reference's rows are that rule's already
        (reference against reference). A candidate's are not: judged through the float64
        oracle -- HF's model -- a free-running engine passes against llama.cpp by being close
        to HF (ctranslate2 on falcon#1: 5.6e-8 from llama.cpp and "pass"), and fails against
        it when it computes llama.cpp's model to 1e-13 (qwen2#1's window). So its distance
        to each side, which the row holds as ``nmse``, is judged by the pair's NMSE bound."""
        if not self.candidate:
            return a["status"], b["status"]
        bound = _number(pair.get("tol_nmse"))
        return _within(a, bound), _within(b, bound)


def witness_names() -> list[str]:
    """What ``--triangulate`` takes: the references outside the pair, then the candidates that
    run an engine of its own (``Candidate.engine_packages``; not impl, nor a reference's code)."""

    refs = [n for n in references.names() if n not in PAIR_SIDES]
    return refs + [n for n in candidates.names() if _engine_packages(n)]


def _engine_packages(name: str) -> tuple:
    try:
        return tuple(candidates.get(name).engine_packages)
    except UsageError:  # a plug-in that does not load is no witness (`conformance list` says why)
        return ()


def as_witness(name: str) -> Witness:
    """``name`` as a witness, or a one-line ``UsageError`` naming the valid ones (exit 2)."""
    valid = witness_names()
    if name not in valid:
        raise UsageError(f"--triangulate {name!r}: not a witness; valid: {', '.join(valid)}")
    if name in references.names():
        ref = references.get(name)
        if not ref.available():
            raise UsageError(f"--triangulate {name}: reference {name} is not installed "
                             f"(pip install -e '.[{ref.requires}]')")
        return Witness(name, False, False, _extra_packages(ref.requires))

    cand = candidates.get(name)
    packages = tuple(cand.engine_packages)
    # as a reference's available(): an engine that is not installed would refuse every case
    # alike (its validate), and a table of that one refusal says nothing of the findings
    missing = [p for p in packages if _version(p) is None]
    if missing:
        raise UsageError(f"--triangulate {name}: candidate {name}'s engine is not installed "
                         f"({', '.join(missing)}; pip install -e '.[engines]')")
    return Witness(name, True, bool(cand.teacher_forced), packages)


def _extra_packages(extra: str) -> tuple:
    """The distributions the project's extra ``extra`` installs here (a reference's
    ``requires``: mlx -> mlx, mlx-lm), read from the project's own metadata."""

    try:
        reqs = [packaging_requirements.Requirement(r) for r in requires("attn-conformance") or ()]
    except PackageNotFoundError:
        return ()
    return tuple(dict.fromkeys(r.name for r in reqs if r.marker and r.marker.evaluate({"extra": extra})))


def table_path(witness: str) -> Path:
    return TABLES / f"{witness}.json"


def load_tables() -> dict[str, dict]:
    """Every stored table, by witness: the references' first (the third implementation the
    project is judged against), then the engines', each by name."""

    paths = sorted(TABLES.glob("*.json")) if TABLES.is_dir() else []
    return {p.stem: json.loads(p.read_text())
            for p in sorted(paths, key=lambda p: (p.stem not in references.names(), p.stem))}


def classify(vs_reference: str, vs_candidate: str, reference: str, candidate: str) -> str:
    """The verdict from the witness's two statuses at one probe (``pass`` or anything else)."""
    a, b = vs_reference == "pass", vs_candidate == "pass"
    if a and b:
        return "both"
    if a:
        return NAMES.get(reference, reference)
    if b:
        return NAMES.get(candidate, candidate)
    return "neither"


def command_of(row) -> str:
    """A ``conformance run`` of the case a row belongs to."""
    parts = ["conformance run", f"--family {row['family']}", "--ref all"]
    for flag, col, default in (("--backend", "backend", "numpy"), ("--dtype", "dtype", "float32"),
                               ("--kv", "kv", "decode"), ("--schedule", "schedule", "mixed"),
                               ("--seed", "seed", 0), ("--tokens", "tokens", 16), ("--gguf-type", "gguf_type", "f32")):
        v = row.get(col)
        if v is not None and str(v) != str(default) and str(v) != "":
            parts.append(f"{flag} {v}")
    if row.get("kv") != "decode" and int(row.get("seqs") or 2) != 2:
        parts.append(f"--seqs {row['seqs']}")
    if row.get("variant"):
        parts.append(f"--variant {row['variant']}")
    # what case_of reads from the row too, so that the command is the case re-run
    if isinstance(row.get("weights"), str) and row["weights"] not in ("", "random"):
        parts.append(f"--weights {row['weights']}")
    if str(row.get("ragged")) in ("True", "true", "1"):
        parts.append("--ragged")
    for kv in str(row.get("overrides") or "").split(";"):
        if kv:
            parts.append(f"--set {kv}")
    return " ".join(parts)


def case_of(row, refs: str, candidate: str = "impl"):
    """The case a baseline row belongs to, run with ``refs`` and ``candidate`` judged."""
    def val(col, default=None):
        v = row.get(col)
        return default if v is None or (not isinstance(v, str) and pd.isna(v)) or v == "" else v

    def value(raw: str):
        # the row writes a list as Python does (layer_types=['full_attention', ...])
        try:
            return ast.literal_eval(raw) if raw.strip().startswith(("[", "{", "(")) else parse_value(raw)
        except (ValueError, SyntaxError):
            return parse_value(raw)

    overrides = tuple((k, value(v)) for k, _, v in (kv.partition("=") for kv in
                                                    str(val("overrides", "")).split(";") if kv))
    kw = dict(family=row["family"], backend=val("backend", "numpy"), dtype=val("dtype", "float32"),
              kv=val("kv", "decode"), schedule=val("schedule", "mixed"), seed=int(val("seed", 0)),
              tokens=int(val("tokens", 16)), gguf_type=val("gguf_type", "f32"), variant=val("variant"),
              weights=val("weights", "random"), ragged=bool(val("ragged", False)), overrides=overrides, ref=refs,
              candidate=candidate)
    if val("kv", "decode") != "decode" and val("seqs") is not None:
        kw["seqs"] = int(val("seqs"))
    return Case(**kw)


def _first(rows, label: str, f: dict, witness: str, teacher_forced: bool = False):
    """The witness's two rows, and the pair's, at the first probe the finding excused that it
    exposes (``teacher_forced``: in the layer where the pair starts to differ, past its input)."""

    order = {p: i for i, p in enumerate(LAYER_PROBES)}
    excused = [r for r in rows if r["candidate"] == f["candidate"] and r["reference"] == f["reference"]
               and r["status"] == "finding" and f"finding {label}:" in (r["reason"] or "")]
    def where(r):  # decoder layers in order, then the model's own probes (layer -1: final norm, logits)
        layer = int(r["layer"]) if str(r["layer"]).lstrip("-").isdigit() else -1
        return (layer if layer >= 0 else 1 << 20, order.get(r["probe"], len(order)))

    excused = sorted(excused, key=where)
    if teacher_forced and excused:
        # fed each side's own input to every layer: agreeing with a side past the layer where
        # the pair starts to differ is agreeing with the input it was fed, not computing that
        # side's model -- and where they differ from a layer's input on (the embedding), the
        # difference is in what it is fed, never in what it computes
        origin = excused[0]
        excused = [] if origin["probe"] == "layer_in" else [r for r in excused if r["layer"] == origin["layer"]]
    for r in excused:
        key = (r["layer"], r["probe"])
        a = next((x for x in rows if x["candidate"] == witness and x["reference"] == f["reference"]
                  and (x["layer"], x["probe"]) == key), None)
        b = next((x for x in rows if x["candidate"] == witness and x["reference"] == f["candidate"]
                  and (x["layer"], x["probe"]) == key), None)
        if a is None or b is None or "not-exposed" in (a["status"], b["status"]):
            continue
        return key, a, b, r
    return None


def measure(run_dir: Path, witness: str, families: list[str] | None = None, progress=None) -> dict:
    """The table: a verdict for every HF-vs-llama.cpp finding ``run_dir`` reached."""
    w = as_witness(witness)
    pol = load_policy()
    df = read_rows(Path(run_dir))
    df = df[df["status"] == "finding"]
    out = {}
    for f in pol.findings:
        if f["candidate"] != "llamacpp" or f["reference"] not in ("hf", "hf_cached"):
            continue
        fams = f["family"] if isinstance(f["family"], list) else [f["family"]]
        if families and not set(fams) & set(families):
            continue
        label = f["_n"]
        mine = df[df["reason"].str.contains(f"finding {label}:", regex=False)]
        if not len(mine):
            continue
        worst = mine.loc[pd.to_numeric(mine["nmse"]).idxmax()]
        refs = w.refs(f)
        case = case_of(worst, refs, candidate=w.name if w.candidate else "impl")
        entry = {"case": command_of(worst).replace("--ref all", (f"--candidate {w.name} " if w.candidate else "")
                                                   + f"--ref {refs}")}
        if f.get("triangulate"):
            # the finding's own settings for the re-run (its `triangulate` table): where the worst
            # case also trips a difference of the witness's own that comes first in the dataflow
            # (gemma2: mlx-lm slides no layer), a setting that leaves the finding and takes that away
            extra = tuple(sorted(f["triangulate"].items()))
            case = replace(case, overrides=tuple((k, v) for k, v in case.overrides if k not in f["triangulate"]) + extra)
            entry["case"] += "".join(f" --set {k}={v}" for k, v in extra)
        if progress:
            progress(f"{label}: {entry['case']}")
        try:
            rows, _ = case_module.run_case(case, pol)
        except UsageError as e:
            out[label] = {**entry, "verdict": "not covered", "why": str(e)}
            continue
        # the witness's own rows: as a candidate (an engine; a reference against the pair) or as
        # the reference impl is judged against. An engine's refusal is a `skipped` row in its words
        own = [r for r in rows if r["candidate"] == w.name or r["reference"] == w.name]
        lacking = [r for r in own if r["status"] in ("skipped", "not-implemented", "error")]
        if lacking:
            out[label] = {**entry, "verdict": "not covered", "why": lacking[0]["reason"]}
            continue
        got = _first(rows, label, f, w.name, w.teacher_forced)
        if got is None:
            why = (f"{w.name} is fed each side's own input to every layer (teacher-forced) and computes none of "
                   "the probes the finding excused in the layer where the pair starts to differ"
                   if w.teacher_forced else f"the re-run excused no probe {w.name} exposes")
            out[label] = {**entry, "verdict": "not covered", "why": f"{why} (or the finding was not reached)"}
            continue
        (layer, probe), a, b, pair = got
        sa, sb = w.statuses(a, b, pair)
        bound = _number(pair.get("tol_nmse")) if w.candidate else None
        at = f"L{layer}.{probe}" if int(layer) >= 0 else probe  # layer -1: the model's own (final_norm, logits)
        out[label] = {**entry, "verdict": classify(sa, sb, f["reference"], f["candidate"]), "at": at,
                      f"vs_{f['reference']}": _fmt(a, sa, bound), f"vs_{f['candidate']}": _fmt(b, sb, bound)}
    table = {"witness": w.name, "run": Path(run_dir).name, "versions": _versions(w.packages), "findings": out}
    if families:
        table["families"] = sorted(families)  # what it was measured over (write keeps it for a new table)
    return table


def _versions(packages: tuple = ()) -> dict:
    """The releases a table was measured on, by their lock names: the pair's, then the witness's."""
    return {d: v for d in (*PAIR_PACKAGES, *packages) if (v := _version(d)) is not None}


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _number(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if x != x else x  # NaN: no number


def _within(row, bound: float | None) -> str:
    """``pass`` where the row's distance is within ``bound``, ``fail`` past it; the row's own
    status where either is missing (an error, a missing probe: nothing to measure)."""
    nmse = _number(row.get("nmse"))
    if nmse is None or bound is None:
        return row["status"]
    return "pass" if nmse <= bound else "fail"


def _fmt(r, status: str | None = None, bound: float | None = None) -> str:
    status = status or r["status"]
    nmse = _number(r.get("nmse"))
    if nmse is None:
        return str(status)
    return f"{status} (nmse {nmse:.3g}" + (f" {'<=' if nmse <= bound else '>'} {bound:.3g})" if bound else ")")


def write(table: dict, families: list[str] | None) -> Path:
    """Store ``table``; a run over some families replaces only theirs."""
    p = table_path(table["witness"])
    if families and p.exists():
        old = json.loads(p.read_text())
        old["findings"].update(table["findings"])
        old["versions"] = table["versions"]
        if "families" in old:  # a table narrowed before stays narrowed: to both runs' families
            old["families"] = sorted(set(old["families"]) | set(table.get("families", ())))
        table = old
    table["findings"] = dict(sorted(table["findings"].items()))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(table, indent=1) + "\n")
    return p
