"""Print the candidates table of the engines (docs/reference/candidates.md,
"What each engine passed") from one or more engines-matrix run directories.

    PYTHONPATH=$PWD:.engines .venv/bin/python scripts/engines_table.py [--summary] RUN_DIR [RUN_DIR ...]

Reads each directory's journal.jsonl (a complete or an interrupted run: the
journal is written case by case); a case met again in a later directory
replaces the earlier one (a re-run with the current code). One row per family,
one column per engine; each cell is the case's verdict over its rows:

* ``pass (n)`` -- every exposed probe passed (n rows compared, against both
  references); ``+ finding`` where a row is a written-down HF vs llama.cpp
  disagreement the engine sits on one side of;
* ``**FAIL** ref Lk probe nmse`` -- the first failing row in dataflow order
  (layer, then the probe order of contract/probes.py), per reference;
* ``skipped [sN]`` -- the engine's own words, listed once under the table;
* ``not-implemented`` parts (a layer kind the engine has no op for) said so.

Then the run time per engine: the sum of the cases' own wall times, and the
part the references' captures took. ``--summary``: one row per engine instead
(the families it passed, failed with the first divergence, and how many it
skipped), then the run time."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contract.probes import PROBES  # noqa: E402

ENGINES = ("ort-gqa", "ort-genai", "openvino", "ctranslate2")
_ORDER = {p: i for i, p in enumerate(PROBES)}


def _cases(dirs):
    out = {}
    for d in dirs:
        j = Path(d) / "journal.jsonl"
        if not j.exists():
            raise SystemExit(f"{d}: no journal.jsonl (give a matrix run directory)")
        for line in j.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[rec["case_id"]] = rec
    return out


def _key(r):
    """Dataflow order: the embeddings, the layers in order (probes as contract/probes.py
    lists them), then the model's own probes after the last layer (final_norm, logits)."""
    layer = r["layer"]
    if layer is None or int(layer) < 0:
        return (-1 if r["probe"] == "embeddings" else 10**9, _ORDER.get(r["probe"], 999))
    return (int(layer), _ORDER.get(r["probe"], 999))


# the refusals that name the arch: one footnote for all (the builder's, the converter's)
_REFUSED = re.compile(r"The (\w+) model is not currently supported|for the model configuration (\w+)")


def _short(why: str) -> tuple[str, str]:
    """(the footnote, what the cell adds): one footnote for every arch the same
    refusal names, the arch in the cell."""
    m = _REFUSED.search(why)
    if m:
        arch = m.group(1) or m.group(2)
        why = why.replace(arch, "<Arch>")
        if " (supported configurations are:" in why:  # the converter's list, cut in the row's reason
            why = why[:why.index(" (supported configurations are:")] + " (then the converter's list of the configurations it has)"
        return why, f": {arch}"
    return why, ""


def _where(r) -> str:
    return "model" if r["layer"] is None or int(r["layer"]) < 0 else f"L{r['layer']}"


def first_failures(rows, cand):
    """Per reference: the first failing row of ``cand`` in dataflow order."""
    out = {}
    for r in sorted((r for r in rows if r["candidate"] == cand and r["status"] in ("fail", "error")), key=_key):
        out.setdefault(r["reference"], r)
    return out


def cell(rows, cand, reasons):
    mine = [r for r in rows if r["candidate"] == cand]
    st = {r["status"] for r in mine}
    if st == {"skipped"}:
        why, arch = _short(mine[0]["reason"])
        if why not in reasons:
            reasons.append(why)
        return f"skipped [s{reasons.index(why) + 1}]{arch}"
    if st & {"fail", "error"}:
        ff = first_failures(rows, cand)
        return "**FAIL** " + "; ".join(
            f"{ref} {_where(r)} `{r['probe']}` nmse {r['nmse']:.3g}"
            if r["status"] == "fail" else f"{ref} error: {r['reason'][:80]}"
            for ref, r in sorted(ff.items()))
    n = sum(r["status"] in ("pass", "finding") for r in mine)
    s = f"pass ({n})"
    if "finding" in st:
        s += " + finding"
    if "not-implemented" in st:
        kinds = sorted({r.get("layer_kind") or "?" for r in mine if r["status"] == "not-implemented"})
        s += f"; {'/'.join(kinds)} layers not-implemented"
    return s


def summary(by, tags) -> None:
    """One row per engine: the families it passed, failed (first divergence), skipped."""
    print("| engine | passed | failed: first divergence (layer, probe, NMSE) | skipped |")
    print("|---|---|---|---|")
    for t in tags:
        ok, bad, sk = [], [], []
        for fam in sorted(by):
            rows = by[fam].get(t)
            if rows is None:
                continue
            c = cell(rows, t.split(" ")[0], [])
            (sk if c.startswith("skipped") else bad if c.startswith("**FAIL**") else ok).append(
                f"{fam}: {c[len('**FAIL** '):]}" if c.startswith("**FAIL**") else fam)
        print(f"| `{t}` | {', '.join(ok) or '-'} | {'; '.join(bad) or '-'} | {len(sk)} |")
    print()


# the references' share of a case's time (harness/pipeline timings): their captures and the
# GGUF export llama.cpp reads -- paid by the first engine to meet a case, cached for the rest
REF_TIMES = ("capture_hf", "capture_hf_cached", "capture_llamacpp", "capture_hf_oracle", "gguf_export")


def main(dirs, only_summary=False) -> int:
    cases = _cases(dirs)
    # one case per family and engine (with its overrides): a later directory's replaces an
    # earlier one's, its time too (a re-run after a fix, or of the same case with other references)
    kept: dict[tuple, dict] = {}
    for rec in cases.values():
        rows = rec["rows"]
        if rows:
            tag = rows[0]["candidate"] + (f" ({rows[0]['overrides']})" if rows[0].get("overrides") else "")
            kept[(rows[0]["family"], tag)] = rec
    by = {}
    secs = 0.0
    per: dict[str, list] = {}  # engine -> [cases, case seconds, of which the references']
    for (fam, tag), rec in kept.items():
        by.setdefault(fam, {})[tag] = rec["rows"]
        times = (rec.get("info") or {}).get("timings") or {}
        t = float(times.get("case_s") or 0.0)
        secs += t
        acc = per.setdefault(rec["rows"][0]["candidate"], [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += t
        acc[2] += sum(float(times.get(k) or 0.0) for k in REF_TIMES)
    tags = [e for e in ENGINES if any(e in v for v in by.values())]
    extra = sorted({t for v in by.values() for t in v if t not in ENGINES})
    tags += extra
    if only_summary:
        summary(by, tags)
        run_time(per)
        return 0
    reasons: list[str] = []
    print("| family | " + " | ".join(f"`{t}`" for t in tags) + " |")
    print("|---|" + "---|" * len(tags))
    for fam in sorted(by):
        cells = [cell(by[fam][t], t.split(" ")[0], reasons) if t in by[fam] else "-" for t in tags]
        print(f"| {fam} | " + " | ".join(cells) + " |")
    print()
    for i, why in enumerate(reasons, 1):
        print(f"- [s{i}] {why.replace('|', '/')}")
    print()
    print(f"{len(kept)} cases; {secs:.0f} s of case time" if secs else f"{len(kept)} cases")
    print()
    run_time(per)
    return 0


def run_time(per) -> None:
    """The run time per engine: the cases' own wall times (info.timings.case_s), and the part
    of them the references' captures took where the capture cache missed (the rest is the
    engine's: converting, building, running, and the judging)."""
    print("| engine | cases run | case time (sum) | of which the references' captures | the rest (engine, judging) "
          "| mean per case |")
    print("|---|---|---|---|---|---|")
    for cand, (n, t, ref) in sorted(per.items(), key=lambda kv: ENGINES.index(kv[0]) if kv[0] in ENGINES else 99):
        print(f"| `{cand}` | {n} | {t:.0f} s | {ref:.0f} s | {t - ref:.0f} s | {t / n:.1f} s |")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2].strip())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    args = sys.argv[1:]
    sys.exit(main([a for a in args if a != "--summary"], only_summary="--summary" in args))
