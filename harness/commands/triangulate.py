"""Whom a third implementation follows where HF and llama.cpp disagree (issue 38).

For every finding between HF (or HF's cached path) and llama.cpp that a run
reached, the case that measured it worst is run again with a witness beside the
pair (``--ref hf,llamacpp,mlx``). At the first probe the finding excused in that
re-run (dataflow order: where the two start to differ), the witness is compared
with each side by the same rule a reference pair is judged by (the policy's
bound): it agrees with the side it passes against. The verdicts:

- ``HF`` / ``llama.cpp``: it passes against that side and not the other;
- ``neither``: it fails against both (a divergence of its own: the page says so);
- ``both``: it passes against both (the pair's difference is below the bound at
  that probe in this case: nothing to take sides on);
- ``not covered``: it does not implement the family or setting (its refusal), or
  failed (its error), or exposes none of the probes the finding excused.

``conformance divergences --triangulate mlx`` measures and writes the table
(``fixtures/triangulation/<witness>.json``, with the versions it was measured
on); ``conformance divergences`` reads it into a column per witness. A table
measured on other versions than the lock's says so on the page.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from ..errors import UsageError

TABLES = Path(__file__).resolve().parents[2] / "fixtures" / "triangulation"
PAIR_SIDES = ("hf", "hf_cached", "llamacpp")  # the references a finding's pair is drawn from
NAMES = {"hf": "HF", "hf_cached": "HF (cached)", "llamacpp": "llama.cpp"}


def table_path(witness: str) -> Path:
    return TABLES / f"{witness}.json"


def load_tables() -> dict[str, dict]:
    """Every stored table, by witness."""
    out = {}
    for p in sorted(TABLES.glob("*.json")) if TABLES.is_dir() else []:
        out[p.stem] = json.loads(p.read_text())
    return out


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
    for kv in str(row.get("overrides") or "").split(";"):
        if kv:
            parts.append(f"--set {kv}")
    return " ".join(parts)


def case_of(row, refs: str):
    """The case a baseline row belongs to, run with ``refs``."""
    import pandas as pd

    from ..case import Case
    from ..cli import parse_value

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
              weights=val("weights", "random"), ragged=bool(val("ragged", False)), overrides=overrides, ref=refs)
    if val("kv", "decode") != "decode" and val("seqs") is not None:
        kw["seqs"] = int(val("seqs"))
    return Case(**kw)


def _first(rows, label: str, f: dict, witness: str):
    """The witness's two statuses at the first probe the finding excused that it exposes."""
    from contract.probes import LAYER_PROBES

    order = {p: i for i, p in enumerate(LAYER_PROBES)}
    excused = [r for r in rows if r["candidate"] == f["candidate"] and r["reference"] == f["reference"]
               and r["status"] == "finding" and f"finding {label}:" in (r["reason"] or "")]
    def where(r):  # decoder layers in order, then the model's own probes (layer -1: final norm, logits)
        layer = int(r["layer"]) if str(r["layer"]).lstrip("-").isdigit() else -1
        return (layer if layer >= 0 else 1 << 20, order.get(r["probe"], len(order)))

    for r in sorted(excused, key=where):
        key = (r["layer"], r["probe"])
        a = next((x for x in rows if x["candidate"] == witness and x["reference"] == f["reference"]
                  and (x["layer"], x["probe"]) == key), None)
        b = next((x for x in rows if x["candidate"] == witness and x["reference"] == f["candidate"]
                  and (x["layer"], x["probe"]) == key), None)
        if a is None or b is None or "not-exposed" in (a["status"], b["status"]):
            continue
        return key, a, b
    return None


def measure(run_dir: Path, witness: str, families: list[str] | None = None, progress=None) -> dict:
    """The table: a verdict for every HF-vs-llama.cpp finding ``run_dir`` reached."""
    import pandas as pd

    from .. import references
    from ..case import run_case
    from ..policy import load_policy
    from ..report import read_rows

    if witness not in references.names() or witness in PAIR_SIDES:
        raise UsageError(f"--triangulate {witness!r}: not a witness; valid: "
                         f"{', '.join(n for n in references.names() if n not in PAIR_SIDES)}")
    if not references.get(witness).available():
        raise UsageError(f"--triangulate {witness}: reference {witness} is not installed "
                         f"(pip install -e '.[{references.get(witness).requires}]')")
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
        case = case_of(worst, f"{f['reference']},{f['candidate']},{witness}")
        entry = {"case": command_of(worst).replace("--ref all", f"--ref {f['reference']},{f['candidate']},{witness}")}
        if progress:
            progress(f"{label}: {entry['case']}")
        try:
            rows, _ = run_case(case, pol)
        except UsageError as e:
            out[label] = {**entry, "verdict": "not covered", "why": str(e)}
            continue
        own = [r for r in rows if r["candidate"] == witness or r["reference"] == witness]
        lacking = [r for r in own if r["status"] in ("not-implemented", "error")]
        if lacking:
            out[label] = {**entry, "verdict": "not covered", "why": lacking[0]["reason"]}
            continue
        got = _first(rows, label, f, witness)
        if got is None:
            out[label] = {**entry, "verdict": "not covered",
                          "why": f"the re-run excused no probe {witness} exposes (or the finding was not reached)"}
            continue
        (layer, probe), a, b = got
        out[label] = {**entry, "verdict": classify(a["status"], b["status"], f["reference"], f["candidate"]),
                      "at": f"L{layer}.{probe}", f"vs_{f['reference']}": _fmt(a), f"vs_{f['candidate']}": _fmt(b)}
    return {"witness": witness, "run": Path(run_dir).name, "versions": _versions(), "findings": out}


def _versions() -> dict:
    """The releases a table was measured on, by their lock names."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "llama-cpp-python", "mlx-lm", "mlx"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def _fmt(r) -> str:
    try:
        return f"{r['status']} (nmse {float(r['nmse']):.3g})"
    except (TypeError, ValueError):
        return str(r["status"])


def write(table: dict, families: list[str] | None) -> Path:
    """Store ``table``; a run over some families replaces only theirs."""
    p = table_path(table["witness"])
    if families and p.exists():
        old = json.loads(p.read_text())
        old["findings"].update(table["findings"])
        old["versions"] = table["versions"]
        table = old
    table["findings"] = dict(sorted(table["findings"].items()))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(table, indent=1) + "\n")
    return p
