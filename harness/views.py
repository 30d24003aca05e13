"""The readable views of one run directory, all made from its rows.

- ``summary.md``: features x families (status, worst NMSE), failures first --
  ready for a CI job summary;
- ``report.html``: a heatmap of families x features coloured by the worst error
  relative to its tolerance, with a drill-down to each case's per-layer,
  per-probe table; one self-contained file, every shown string escaped;
- ``junit.xml``: one test case per matrix case;
- ``plots/<case>.png``: error against layer and probe (drawn per case, by the
  worker that ran it).

The views depend only on the rows and the stable part of meta.json (spec,
versions), so a merged set of shards renders exactly as the unsharded run.
"""

from __future__ import annotations

import html
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote
import hashlib
import shutil
import io
import base64

from . import references, atomic
from .features import REFERENCE_GAPS, SPEC_DECORATIONS

# A case's status is the first of CASE_ORDER its rows have: one failing row fails the
# case; a case passes only when impl was checked (harness/verdict.py: unguarded first).
from .verdict import CASE_ORDER, FAILING  # noqa: E402
from harness.lazy import lazy
from .report import exit_status
from .versions import REFERENCE_PACKAGES
from . import cache
from contract.probes import LAYER_PROBES

pd = lazy("pandas")
backend_agg = lazy("matplotlib.backends.backend_agg")
matplotlib_figure = lazy("matplotlib.figure")
ticker = lazy("matplotlib.ticker")
Image = lazy("PIL.Image")

GLYPH = {"unguarded": "❌ UNGUARDED", "missing": "❌ missing", "error": "❌ error", "fail": "❌ FAIL",
         "pass": "✅ pass", "finding": "⚠️ finding",
         "not-implemented": "➖ not implemented", "not-exposed": "➖ not exposed", "skipped": "➖ skipped"}


def case_status(statuses) -> str:
    s = set(statuses)
    return next((x for x in CASE_ORDER if x in s), "skipped")


def _err(df: pd.DataFrame) -> pd.Series:
    """The error a row was judged by: NMSE to the float64 oracle at low precision, else NMSE."""
    if "nmse_cand_oracle" in df:
        return df["nmse_cand_oracle"].where(df["nmse_cand_oracle"].notna(), df.get("nmse"))
    return df["nmse"] if "nmse" in df else pd.Series(math.nan, index=df.index)


def is_candidate(df: pd.DataFrame) -> pd.Series:
    """The rows that judge a case's candidate (impl, or another engine), not the
    references against each other (harness/verdict.py ``candidate_rows``)."""

    return ~df["candidate"].isin(references.names())


def cases(df: pd.DataFrame) -> pd.DataFrame:
    """One line per case, in row order: its candidate, status, findings, the
    candidate's worst NMSE and error/tolerance (over the rows judged pass or fail:
    a finding is reported as one, not as the candidate's error), the first failing row."""
    cols = ["case_id", "family", "candidate", "features", "status", "findings", "worst_nmse", "worst_ratio",
            "first_fail"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    mine = is_candidate(df)
    by = df.groupby("case_id", sort=False)
    rank = df["status"].map({s: i for i, s in enumerate(CASE_ORDER)}).fillna(len(CASE_ORDER))
    out = pd.DataFrame({"family": by["family"].first(),
                        "candidate": df["candidate"].where(mine).groupby(df["case_id"], sort=False).first()
                        .reindex(by["family"].first().index).fillna("impl"),
                        "features": by["features"].first().map(lambda s: [f for f in str(s).split(";") if f]),
                        "status": rank.groupby(df["case_id"], sort=False).min().map(
                            lambda i: CASE_ORDER[int(i)] if i < len(CASE_ORDER) else "skipped"),
                        "findings": (df["status"] == "finding").groupby(df["case_id"], sort=False).sum().astype(int)})
    # a case in which no comparison of its candidate passed checked nothing of it, whatever
    # its other rows say (harness/verdict.py rule 3; rows a run makes carry their own
    # `unguarded` rows, this holds for any rows a view is given)
    impl_pass = (mine & (df["status"] == "pass")).groupby(df["case_id"], sort=False).any()
    quiet = ~out["status"].isin(FAILING + ("skipped",)) & ~impl_pass.reindex(out.index).fillna(False).astype(bool)
    out.loc[quiet, "status"] = "unguarded"
    judged = df[mine & df["status"].isin(("pass", "fail"))]
    for col, src in (("worst_nmse", "nmse"), ("worst_ratio", "err_ratio")):
        vals = pd.to_numeric(judged[src], errors="coerce") if src in judged else pd.Series(dtype=float)
        out[col] = vals.groupby(judged["case_id"]).max().reindex(out.index) if len(vals) else math.nan
    bad = df[df["status"].isin(FAILING)].drop_duplicates("case_id")  # the first failing row of each case
    out["first_fail"] = pd.Series({r["case_id"]: _where(r) for _, r in bad.iterrows()}, dtype=object) \
        .reindex(out.index).fillna("")
    return out.rename_axis("case_id").reset_index()[cols]


def _where(r) -> str:
    at = f"L{r['layer']} {r['probe']}" if r["layer"] >= 0 else (r["probe"] if r["probe"] not in ("", "*") else "case")
    return f"{r['candidate']} vs {r['reference']}, {at}: {r['reason']}"


def case_counts(df: pd.DataFrame) -> dict:
    return cases(df)["status"].value_counts().to_dict() if not df.empty else {}


def feature_order(tags) -> list[str]:
    """The spec's decorations in the spec's order, then any other tag."""
    tags = set(tags)
    return [t for t in SPEC_DECORATIONS if t in tags] + sorted(tags - set(SPEC_DECORATIONS))


def _tally(cells: dict, key, c) -> None:
    cell = cells.setdefault(key, {"cases": 0, "failing": 0, "findings": 0, "passing": 0,
                                  "worst_nmse": math.nan, "worst_ratio": math.nan})
    cell["cases"] += 1
    cell["failing"] += c.status in FAILING
    cell["passing"] += c.status == "pass"
    cell["findings"] += c.findings > 0
    cell["worst_nmse"] = _nanmax(cell["worst_nmse"], c.worst_nmse)
    cell["worst_ratio"] = _nanmax(cell["worst_ratio"], c.worst_ratio)


def candidate_grid(cs: pd.DataFrame) -> tuple[list[str], list[str], dict]:
    """``(candidates, families, {(candidate, family): cell})``: impl first, then by name."""
    fams = sorted(cs["family"].unique()) if len(cs) else []
    cells: dict = {}
    for c in cs.itertuples():
        _tally(cells, (c.candidate, c.family), c)
    cands = sorted({k for k, _ in cells}, key=lambda n: (n != "impl", n))
    return cands, fams, cells


def grid(cs: pd.DataFrame) -> tuple[list[str], list[str], dict]:
    """``(features, families, {(feature, family): cell})``; features with a failing
    case first (most failures first), then the spec's order."""
    fams = sorted(cs["family"].unique()) if len(cs) else []
    cells = {}
    for c in cs.itertuples():
        for f in c.features:
            _tally(cells, (f, c.family), c)
    feats = feature_order({f for f, _ in cells})
    fails = {f: sum(cells[(f, fam)]["failing"] for fam in fams if (f, fam) in cells) for f in feats}
    feats.sort(key=lambda f: -fails[f])  # stable: the spec's order within equal counts
    return feats, fams, cells


def _nanmax(a: float, b: float) -> float:
    if isinstance(b, float) and math.isnan(b):
        return a
    return b if math.isnan(a) else max(a, b)


def cell_status(cell: dict | None) -> str:
    if not cell:
        return ""
    if cell["failing"]:
        return "fail"
    if cell["passing"]:
        return "finding" if cell["findings"] else "pass"
    return "not compared"


def _g(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2g}"


def _md(s) -> str:
    """A table cell: no line breaks, pipes escaped, no raw HTML for the renderer."""
    return " ".join(str(s).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def verdict(df: pd.DataFrame) -> str:
    return run_model(df, {}).verdict


def unverified(cs: pd.DataFrame) -> list[str]:
    return [t for t, _ in _unverified(cs)]


NOT_COMPARED = ("not-implemented", "not-exposed", "skipped")


def _unverified(cs: pd.DataFrame) -> list[tuple[str, str]]:
    """Each spec decoration no case of the run passed, with what the run did with
    it: failed in the cases that exercise it, exercised but never compared, or
    never exercised (a reference gap, or no case of this run)."""
    out = []
    for t in SPEC_DECORATIONS:
        st = [s for fs, s in zip(cs["features"], cs["status"]) if t in fs] if len(cs) else []
        if "pass" in st:
            continue
        n_fail = sum(s in FAILING for s in st)
        if n_fail:
            why = f"exercised by {len(st)} case{'s' * (len(st) != 1)}, failing in {n_fail}, passing in none"
        elif st:
            why = f"exercised by {len(st)} case{'s' * (len(st) != 1)}, compared in none (skipped / not exposed)"
        else:
            why = REFERENCE_GAPS.get(t, "no case of this run exercises it")
        out.append((t, why))
    return out


@dataclass(frozen=True)
class RunModel:
    """One run as every view tells it (summary.md, report.html, the commands' last
    line): each statement is made here once and only rendered by a view, so two
    views of one run cannot say different things."""

    name: str
    kind: str  # "matrix", or "run" for one case (conformance run / judge)
    verdict: str  # PASS / FAIL / ERROR (only errors failed: nothing judged wrong, something crashed)
    headline: str  # one sentence: how many cases failed, or that nothing was compared
    case_counts: dict  # status -> cases, in CASE_ORDER
    row_counts: dict  # status -> rows
    cases: pd.DataFrame
    failing: pd.DataFrame  # the failing cases, in row order
    grid: tuple  # (features, families, cells)
    candidate_grid: tuple  # (candidates, families, cells)
    findings: list  # (family, comparison, cases, reason)
    unverified: list  # (decoration, what the run did with it)
    not_compared: list  # (status, rows, reason), the most frequent first
    excluded: list  # (cases, reason)
    footer: str
    # the failing cases grouped by their first failure, numbers and sizes aside: 50 cases with
    # one KeyError are one group of 50 (issue 41); (first failure, status, [case ids])
    failure_groups: list = ()
    # the references' versions, and whether they are the calibrated ones (lock.txt): the
    # header of every view, so a verdict made on another release says so where it is read
    versions_line: str = ""
    calibrated: bool = True

    def counts_text(self) -> str:
        return (" · ".join(f"{s} {self.case_counts[s]}" for s in CASE_ORDER if self.case_counts.get(s))
                or "no cases")

    def last_line(self) -> str:
        """The last line a judging command prints: the verdict and the counts."""
        rows = ", ".join(f"{k} {v}" for k, v in sorted(self.row_counts.items())) or "none"
        return f"{self.verdict}: {self.headline} (cases: {self.counts_text().replace(' · ', ', ')}; rows: {rows})"


def run_model(df: pd.DataFrame, meta: dict) -> RunModel:
    cs = cases(df)
    spec = meta.get("spec", {})
    cc = cs["status"].value_counts().to_dict() if len(cs) else {}
    rc = df["status"].value_counts().to_dict() if len(df) and "status" in df else {}
    failing = cs[cs["status"].isin(FAILING)]
    n_fail, n = len(failing), len(cs)
    judged = any(rc.get(s) for s in ("pass", "fail", "finding"))
    if not len(df):
        headline = "Nothing was compared (zero rows): this run fails."
    elif n_fail:
        errs = int((failing["status"] == "error").sum())
        headline = f"{n_fail} of {n} case{'s' * (n != 1)} failing" + (
            f" ({errs} with an error)" if errs and errs < n_fail else " (every one an error)" if errs else "")
        if not judged:
            headline += "; no comparison was made"
    elif not cc.get("pass"):
        headline = "No case compared anything (all skipped / not exposed): this run fails."
    else:
        rest = n - cc.get("pass", 0)
        headline = f"{cc['pass']} of {n} case{'s' * (n != 1)} pass" + (
            f", {rest} not compared (skipped / not exposed / not implemented)" if rest else "")
    if n_fail and (failing["status"] == "error").all():
        word = "ERROR"
    else:
        word = "PASS" if exit_status(df) == 0 and not n_fail and cc.get("pass") else "FAIL"
    findings = []
    if "status" in df and (df["status"] == "finding").any():
        fd = df[df["status"] == "finding"]
        for (fam, cand, ref, why), g in fd.groupby(["family", "candidate", "reference",
                                                     fd["reason"].str.split(" -- known disagreement: ").str[-1]]):
            findings.append((fam, f"{cand} vs {ref}", g["case_id"].nunique(), why))
    other = df[df["status"].isin(NOT_COMPARED)] if len(df) else df
    not_compared = [(st, len(g), why) for (st, why), g in
                    sorted(other.groupby(["status", "reason"]), key=lambda kv: -len(kv[1]))[:15]] if len(other) else []
    v = meta.get("versions", {})
    footer = (f"spec {spec.get('path', '?')} · commit {v.get('git_commit')} · "
              + " · ".join(f"{k} {v.get(k)}" for k in ("python", "numpy", "torch", "transformers",
                                                        "llama_cpp_python", "gguf")))
    kind = "run" if meta.get("command") in ("run", "judge") else "matrix"
    vline, calib = versions_line(meta)
    return RunModel(str(spec.get("name", "?")), kind, word, headline, cc, rc, cs, failing, grid(cs), candidate_grid(cs),
                    findings, _unverified(cs), not_compared,
                    [(e["count"], e["reason"]) for e in spec.get("excluded", []) if e.get("count")], footer,
                    versions_line=vline, calibrated=calib, failure_groups=failure_groups(failing))


_SIZES = re.compile(r"0x[0-9a-f]+|[-+]?\d+(\.\d+)?(e[-+]?\d+)?", re.I)


def failure_groups(failing: pd.DataFrame) -> list[tuple[str, str, list[str]]]:
    """The failing cases grouped by what failed: the first failure's text with its
    numbers (sizes, NMSEs, addresses) set aside, and the status; the largest group
    first, then in row order. ``(an example's first failure, status, case ids)``."""
    groups: dict = {}
    for c in failing.itertuples():
        text = str(c.first_fail)
        # the comparison and the reason, not the layer or probe it showed first at
        head, _, why = text.partition(": ")
        key = (c.status, head.split(", ")[0], _SIZES.sub("#", why))
        groups.setdefault(key, (text, c.status, []))[2].append(c.case_id)
    return sorted(groups.values(), key=lambda g: -len(g[2]))


def versions_line(meta: dict) -> tuple[str, bool]:
    """The references' versions as a run recorded them, and whether they are the ones its
    verdicts were calibrated on (meta ``calibration``, written from lock.txt): one line for
    every view's header. ``("", True)`` for a run that recorded neither (a run made before
    the lock)."""

    v = meta.get("versions") or {}
    if not v:
        return "", True
    refs = ", ".join(f"{p.replace('_', '-')} {v.get(p) or 'not installed'}" for p in REFERENCE_PACKAGES)
    cal = meta.get("calibration")
    if cal is None:
        return f"references: {refs}", True
    d = cal.get("drift") or []
    if not d:
        return f"references: {refs} · the calibrated versions (lock.txt)", True
    parts = ", ".join(f"{p.replace('_', '-')} {have or 'not installed'} (calibrated: {want or 'not installed'})"
                      for p, have, want in d)
    return (f"references: {refs} · NOT the calibrated versions: {parts} -- verdicts were calibrated on lock.txt; "
            "a difference may be the release (conformance upstream)"), False


# ---------------------------------------------------------------- summary.md
def summary_md(df: pd.DataFrame, meta: dict) -> str:
    m = run_model(df, meta)
    lines = [f"# Conformance {m.kind} `{_md(m.name)}`: {m.verdict}", "", f"**{_md(m.headline)}**"]
    if m.versions_line:
        lines[-1:-1] = [("" if m.calibrated else "**Warning:** ") + _md(m.versions_line), ""]
    if len(df):
        lines[-1] += (" · cases: " + m.counts_text() + " · rows: "
                      + " · ".join(f"{s} {n}" for s, n in sorted(m.row_counts.items())))
    if len(m.failing):
        lines += ["", "## Failing cases", "", "Grouped by what failed first (numbers aside); an error's traceback "
                  "is in log.txt and report.html.", "", "| first failure | status | cases | which |", "|---|---|---|---|"]
        for text, st, ids in m.failure_groups[:50]:
            which = ", ".join(f"`{_md(i)}`" for i in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
            lines.append(f"| {_md(text)} | {st} | {len(ids)} | {which} |")
        if len(m.failure_groups) > 50:
            lines.append(f"| ... {len(m.failure_groups) - 50} more groups (rows.parquet, report.html) | | | |")
    if m.not_compared:
        lines += ["", "## Not compared", "", "| status | rows | reason |", "|---|---|---|"]
        lines += [f"| {st} | {k} | {_md(why)} |" for st, k, why in m.not_compared]
    cands, cfams, ccells = m.candidate_grid
    if cands:
        lines += ["", "## Candidates × families", "",
                  "Each cell: the cases of that family judging that candidate (engine); failing / cases and the "
                  "worst NMSE of the candidate against the references.", ""]
        lines += _md_grid("candidate", cands, cfams, ccells, bold=False)
    feats, fams, cells = m.grid
    if feats:
        lines += ["", "## Features × families", "",
                  "Each cell: the cases of that family with that feature; worst NMSE of each case's candidate "
                  "against the references.", ""]
        lines += _md_grid("feature", feats, fams, cells, bold=True)
    if m.findings:
        lines += ["", "## Findings (known reference disagreements, not failures)", "",
                  "| family | comparison | cases | reason |", "|---|---|---|---|"]
        lines += [f"| {_md(fam)} | {_md(cmp)} | {k} | {_md(why)} |" for fam, cmp, k, why in m.findings]
    if m.unverified:
        lines += ["", "## Unverified decorations", "", "Named in the spec, passed by no case of this run:", ""]
        lines += [f"- `{t}`: {_md(why)}" for t, why in m.unverified]
    if m.excluded:
        lines += ["", "## Excluded by the spec", "", "| cases | reason |", "|---|---|"]
        lines += [f"| {k} | {_md(why)} |" for k, why in m.excluded]
    lines += ["", f"_{_md(m.footer)}_", ""]
    return "\n".join(lines)


def _html_grid(head: str, keys: list, fams: list, cells: dict, keys_as_columns: bool = False) -> list[str]:
    """A heatmap table of ``cells[(key, family)]``, keys as rows (``keys_as_columns``:
    families as rows -- the candidates table, one or two engines over ~90 families, was
    one row of 88 columns); each cell carries ``data-{head}`` and ``data-family``
    (clicking it lists its cases)."""
    e = html.escape
    rows, cols = (fams, keys) if keys_as_columns else (keys, fams)
    corner = "family" if keys_as_columns else head
    out = [f"<table class='heat'><tr><th>{e(corner)}</th>" + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>"]
    for r in rows:
        tds = []
        for c in cols:
            k, fam = (c, r) if keys_as_columns else (r, c)
            cell = cells.get((k, fam))
            if not cell:
                tds.append("<td class='empty'></td>")
                continue
            st = cell_status(cell)
            label = (f"{cell['failing']}/{cell['cases']} fail" if st == "fail" else st) + f" · {_g(cell['worst_nmse'])}"
            title = f"{cell['cases']} cases; worst err/tol {_g(cell['worst_ratio'])}; findings in {cell['findings']}"
            tds.append(_td(cell, f"data-{head}='{e(k)}' data-family='{e(fam)}'", title, label))
        out.append(f"<tr><th>{e(r)}</th>{''.join(tds)}</tr>")
    out.append("</table>")
    return out


def _md_grid(head: str, keys: list, fams: list, cells: dict, bold: bool) -> list[str]:
    """A markdown table of ``cells[(key, family)]``: failing / cases or the status,
    and the worst NMSE; ``bold``: a key with a failing cell is set in bold."""
    lines = [f"| {head} | " + " | ".join(fams) + " |", "|---|" + "---|" * len(fams)]
    for k in keys:
        row = []
        for fam in fams:
            cell = cells.get((k, fam))
            st = cell_status(cell)
            if not st:
                row.append("")
            elif st == "fail":
                row.append(f"❌ {cell['failing']}/{cell['cases']} · {_g(cell['worst_nmse'])}")
            else:
                row.append(f"{GLYPH.get(st, st)} · {_g(cell['worst_nmse'])}")
        failing = any(cell_status(cells.get((k, fam))) == "fail" for fam in fams)
        lines.append(f"| {'**' + k + '**' if bold and failing else _md(k)} | " + " | ".join(row) + " |")
    return lines


# ---------------------------------------------------------------- report.html
# The one colour scale of report.html (cells, the case table and the legend): a passing
# cell's colour says how far inside its bound the worst error is -- green well inside,
# yellow near the bound, red failing -- so a pass at err/tol 0.12 never reads as a warning.
# (upper bound of err/tol, colour, legend label)
SCALE = ((1e-3, "#1a9850", "pass, err/tol <= 0.001"), (0.1, "#66bd63", "pass, err/tol <= 0.1"),
         (0.5, "#a6d96a", "pass, err/tol <= 0.5"), (math.inf, "#fee08b", "pass, near the bound (err/tol 0.5-1)"))
FAIL_COLOUR, NO_RATIO, NOT_COMPARED_COLOUR = "#d73027", "#c7e9c0", "#d9d9d9"
LEGEND = (*((c, lab) for _, c, lab in SCALE), (NO_RATIO, "pass, no err/tol recorded"),
          (FAIL_COLOUR, "failing"), (NOT_COMPARED_COLOUR, "not compared"))


def _colour(cell: dict | None) -> str:
    """The scale's colour of a cell: its worst err/tol when it passes."""
    st = cell_status(cell)
    if not st or st == "not compared":
        return NOT_COMPARED_COLOUR
    if st == "fail":
        return FAIL_COLOUR
    r = cell["worst_ratio"]
    if r is None or math.isnan(r):
        return NO_RATIO
    return next(c for hi, c, _ in SCALE if r <= hi)


def _ink(bg: str) -> str:
    """Text that reads on ``bg``: dark on a light colour, white on a dark one
    (WCAG relative luminance; white on light grey was unreadable)."""
    def lin(c):
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(int(bg[i:i + 2], 16)) for i in (1, 3, 5))
    return "#222" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.18 else "#fff"


def _td(cell: dict, attrs: str, title: str, label: str) -> str:
    bg = _colour(cell)
    ratio = cell.get("worst_ratio")
    data = "" if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)) else f" data-ratio='{ratio!r}'"
    return (f"<td style='background:{bg};color:{_ink(bg)}' data-status='{html.escape(cell_status(cell))}'"
            f"{data} {attrs} title='{html.escape(title)}'>{html.escape(label)}</td>")


def _num(x):
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else (x if math.isfinite(x) else ("inf" if x > 0 else "-inf"))


def _script_json(obj) -> str:
    # Inside <script>, "</script>" or "<!--" in a value would end or change the
    # element; escaped as \u003c etc. the JSON means the same and cannot.
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;font-size:12px}
td.pass,td.fail,td.error,td.finding,td.skipped,td.not-exposed{white-space:nowrap}
table.heat td{cursor:pointer;min-width:1.4em;text-align:center;font-weight:bold}
table.heat td.empty{background:#f7f7f7;cursor:default}
.swatch{display:inline-block;padding:1px 6px;margin:0 2px;font-size:12px;border-radius:3px}
table.heat th.feat{vertical-align:bottom;padding:2px 1px}
table.heat th.feat span{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}
table.heat td.sel{outline:3px solid #2166ac}
#cases tr{cursor:pointer}
#cases tr:hover{background:#f0f4ff}
.fail,.error{color:#b2182b;font-weight:bold}.pass{color:#1a7f37}.finding{color:#9a6700}
code{font-size:12px}
.scroll{overflow:auto;max-width:100%}.scroll.cases{max-height:70vh}
details.tb pre{white-space:pre-wrap;font-size:11px;background:#f6f6f6;padding:4px}
#versions{font-size:12px;color:#555}#versions.uncalibrated{color:#9a6700;background:#fff8e1;padding:4px 6px}
"""

_JS = """
const D = JSON.parse(document.getElementById('data').textContent);
D.rows = D.rows || {}; D.plots = D.plots || {};
const COLS = ['candidate','reference','layer','probe','status','nmse','max_abs','err/tol','worst','reason'];
let wanted = null;
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; }
function fmt(x) { return (x === null) ? '-' : (typeof x === 'number' ? x.toPrecision(3) : String(x)); }
function render(id) {
  const box = document.getElementById('detail'); box.replaceChildren();
  box.appendChild(el('h2', id));
  const rows = D.rows[id] || [];
  const wrap = el('div', undefined, 'scroll');
  const t = el('table'); const h = el('tr'); COLS.forEach(c => h.appendChild(el('th', c))); t.appendChild(h);
  rows.forEach(r => { const tr = el('tr');
    r.slice(0, COLS.length).forEach((v, i) => tr.appendChild(el('td', i === 2 ? (v < 0 ? '-' : String(v)) : fmt(v),
                                                                i === 4 ? v : '')));
    t.appendChild(tr);
    if (r[COLS.length]) { const tb = el('tr'); const td = el('td'); td.colSpan = COLS.length;
      const d = el('details', undefined, 'tb'); d.appendChild(el('summary', 'traceback')); d.appendChild(el('pre', r[COLS.length]));
      td.appendChild(d); tb.appendChild(td); t.appendChild(tb); } });
  wrap.appendChild(t); box.appendChild(wrap);
  if (D.plots[id]) { const img = el('img'); img.src = D.plots[id]; img.alt = 'error against layer and probe';
    img.style.maxWidth = '100%'; box.appendChild(img); }
  box.scrollIntoView();
}
// a case's detail file (a large run: cases/*.js) calls this when it has loaded
window.caseData = function(id, payload) { D.rows[id] = payload.rows; if (payload.plot) D.plots[id] = payload.plot;
  if (wanted === id) render(id); };
function show(id) {
  if (location.hash !== '#case=' + encodeURIComponent(id)) history.replaceState(null, '', '#case=' + encodeURIComponent(id));
  if (D.rows[id] || !(D.files && D.files[id])) { render(id); return; }
  wanted = id;
  const box = document.getElementById('detail'); box.replaceChildren(el('h2', id), el('p', 'loading ' + D.files[id] + ' ...'));
  const s = document.createElement('script'); s.src = D.files[id];
  s.onerror = () => { box.replaceChildren(el('h2', id), el('p', 'could not load ' + D.files[id])); };
  document.head.appendChild(s);
}
document.querySelectorAll('#cases tbody tr').forEach(tr => tr.addEventListener('click', () => show(tr.dataset.case)));
document.querySelectorAll('a.case-link').forEach(a => a.addEventListener('click', ev => { ev.preventDefault(); show(a.dataset.case); }));
if (location.hash.startsWith('#case=')) show(decodeURIComponent(location.hash.slice(6)));
document.querySelectorAll('table.heat td[data-feature]').forEach(td => td.addEventListener('click', () => {
  document.querySelectorAll('table.heat td.sel').forEach(x => x.classList.remove('sel')); td.classList.add('sel');
  const f = td.dataset.feature, fam = td.dataset.family;
  document.getElementById('filter').textContent = ': ' + fam + ' with ' + f;
  document.querySelectorAll('#cases tbody tr').forEach(tr => {
    tr.hidden = !(tr.dataset.family === fam && tr.dataset.features.split(' ').includes(f)); });
}));
document.querySelectorAll('table.heat td[data-candidate]').forEach(td => td.addEventListener('click', () => {
  document.querySelectorAll('table.heat td.sel').forEach(x => x.classList.remove('sel')); td.classList.add('sel');
  const c = td.dataset.candidate, fam = td.dataset.family;
  document.getElementById('filter').textContent = ': ' + fam + ' judging ' + c;
  document.querySelectorAll('#cases tbody tr').forEach(tr => {
    tr.hidden = !(tr.dataset.family === fam && tr.dataset.candidate === c); });
}));
document.getElementById('all').addEventListener('click', () => {
  document.getElementById('filter').textContent = '';
  document.querySelectorAll('#cases tbody tr').forEach(tr => { tr.hidden = false; }); });
"""


# A run whose case details (rows, plots, tracebacks) come to at most this many bytes keeps
# them in report.html itself: one file, to copy or mail on its own. A larger one writes
# each case's detail beside it (cases/<slug>.js), loaded when the case is opened: the
# default matrix's page was 33.8 MB with every row inside (issue 41); its first page is
# now the summary, the grids and the case list.
EMBED_LIMIT = 2_000_000
DETAIL_COLS = ["candidate", "reference", "layer", "probe", "status", "nmse", "max_abs", "err_ratio", "worst", "reason",
               "detail"]


def case_details(df: pd.DataFrame) -> dict:
    """``{case_id: [row as a list of DETAIL_COLS]}``: what a case's drill-down shows."""
    out: dict = {}
    if not len(df):
        return out
    sub = df.reindex(columns=DETAIL_COLS)
    for cid, g in sub.groupby(df["case_id"], sort=False):
        out[cid] = [[_num(v) if k in ("nmse", "max_abs", "err_ratio") else
                     (int(v) if k == "layer" else ("" if pd.isna(v) else str(v)))
                     for k, v in zip(DETAIL_COLS, r)] for r in g.itertuples(index=False)]
    return out


def case_file(case_id: str) -> str:
    """The detail file of a case, relative to the run directory."""
    return "cases/" + plot_name(case_id)[: -len(".png")] + ".js"


def _detail_table(case_id: str, rows: list, plot: str | None) -> list[str]:
    """One case's per-layer, per-probe table, rendered (a single run's page opens on it);
    an error row's traceback folded under it."""
    e = html.escape
    out = [f"<h2>{e(case_id)}</h2>", "<div class='scroll'><table class='detail'><tr>"
           + "".join(f"<th>{e('err/tol' if c == 'err_ratio' else c)}</th>" for c in DETAIL_COLS[:-1]) + "</tr>"]
    for r in rows:
        cells = []
        for k, v in zip(DETAIL_COLS[:-1], r):
            text = ("-" if v < 0 else str(v)) if k == "layer" else ("-" if v is None else
                                                                   (f"{v:.3g}" if isinstance(v, float) else str(v)))
            cells.append(f"<td class='{e(v) if k == 'status' else ''}'>{e(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
        if r[-1]:
            out.append(f"<tr><td colspan='{len(DETAIL_COLS) - 1}'><details class='tb'><summary>traceback</summary>"
                       f"<pre>{e(r[-1])}</pre></details></td></tr>")
    out.append("</table></div>")
    if plot:
        out.append(f"<img src='{e(plot)}' alt='error against layer and probe' style='max-width:100%'>")
    return out


def report_html(df: pd.DataFrame, meta: dict, plots: dict | None = None, files: dict | None = None) -> str:
    """The run's page. ``plots``: case id -> data URI; ``files``: case id -> its detail
    file (cases/*.js, written by ``write_all`` for a run too large to embed): the rows
    are then not in the page, and a case's detail loads when it is opened."""
    e = html.escape
    m = run_model(df, meta)
    cs = m.cases
    feats, fams, cells = m.grid
    cands, cfams, ccells = m.candidate_grid
    details = case_details(df) if files is None else {}
    out = ["<!doctype html><html><head><meta charset='utf-8'>",
           f"<title>Conformance: {e(m.name)}</title><style>{_CSS}</style></head><body>",
           f"<h1>Conformance {m.kind} {e(m.name)}: <span class='verdict {e(m.verdict)}'>{e(m.verdict)}</span></h1>",
           f"<p id='headline'><strong>{e(m.headline)}</strong> · cases: {e(m.counts_text())}</p>"]
    if m.versions_line:
        out.append(f"<p id='versions' class='{'calibrated' if m.calibrated else 'uncalibrated'}'>"
                   f"{'' if m.calibrated else '<strong>Warning:</strong> '}{e(m.versions_line)}</p>")
    one = m.kind == "run" and len(cs) == 1 and files is None
    if one:  # a single case's page opens on its per-layer table
        cid = cs["case_id"].iloc[0]
        out += ["<div id='run-detail'>", *_detail_table(cid, details.get(cid, []), (plots or {}).get(cid)), "</div>"]
    if len(m.failing):
        out += ["<h2>Failing cases</h2>",
                "<p>Grouped by what failed first (numbers aside). Click a case for its per-layer table; an error "
                "row's traceback is under it (and in log.txt).</p>",
                "<div class='scroll'><table id='failing'><tr><th>first failure</th><th>status</th><th>cases</th>"
                "<th>which</th></tr>"]
        for text, st, ids in m.failure_groups[:50]:
            links = ", ".join(f"<a href='#case={e(quote(i))}' class='case-link' data-case='{e(i)}'>{e(i)}</a>"
                              for i in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
            out.append(f"<tr><td>{e(text)}</td><td class='{e(st)}'>{e(st)}</td><td>{len(ids)}</td><td>{links}</td></tr>")
        if len(m.failure_groups) > 50:
            out.append(f"<tr><td colspan='4'>... {len(m.failure_groups) - 50} more groups (the case table below)</td></tr>")
        out.append("</table></div>")
    if m.not_compared:
        out += ["<h2>Not compared</h2>", "<div class='scroll'><table id='not-compared'><tr><th>status</th><th>rows</th>"
                "<th>reason</th></tr>"]
        out += [f"<tr><td class='{e(st)}'>{e(st)}</td><td>{k}</td><td>{e(why)}</td></tr>" for st, k, why in m.not_compared]
        out.append("</table></div>")
    out += ["<p id='legend'>Colour: " + " ".join(
                f"<span class='swatch' style='background:{c};color:{_ink(c)}'>{e(lab)}</span>" for c, lab in LEGEND)
            + "</p>",
            "<h2>Candidates × families</h2>",
            "<p>The engines judged (impl, or another: <code>--candidate</code>); click a cell to list its cases.</p>",
            "<div class='scroll cases'>", *_html_grid("candidate", cands, cfams, ccells, keys_as_columns=True), "</div>",
            "<h2>Families × features</h2>",
            "<p>Colour: the worst error of each case's candidate relative to its tolerance, on the scale above; "
            "a number: the failing cases. Hover a cell for its cases and worst NMSE, a feature for what it is; "
            "click a cell to list its cases.</p>",
            # families as rows, features as narrow columns with upright-rotated names: the families
            # and ~45 features fit a screen's width; the frame scrolls past it
            "<div class='scroll'><table class='heat'><tr><th>family</th>"
            + "".join(f"<th class='feat' title='{e(SPEC_DECORATIONS.get(f, ('not a spec decoration', ''))[0])}'>"
                      f"<span>{e(f)}</span></th>" for f in feats) + "</tr>"]
    for fam in fams:
        tds = []
        for f in feats:
            cell = cells.get((f, fam))
            st = cell_status(cell)
            if not cell:
                tds.append("<td class='empty'></td>")
                continue
            label = f"{cell['failing']}" if st == "fail" else ""
            title = (f"{fam} · {f}: {cell['failing']}/{cell['cases']} fail" if st == "fail" else f"{fam} · {f}: {st}") \
                + f"; {cell['cases']} cases; worst NMSE {_g(cell['worst_nmse'])}; worst err/tol " \
                  f"{_g(cell['worst_ratio'])}; findings in {cell['findings']}"
            tds.append(_td(cell, f"data-feature='{e(f)}' data-family='{e(fam)}'", title, label))
        out.append(f"<tr><th>{e(fam)}</th>{''.join(tds)}</tr>")
    out.append("</table></div>")
    if m.findings:
        out += ["<h2>Findings (known reference disagreements, not failures)</h2>",
                "<div class='scroll'><table id='findings'><tr><th>family</th><th>comparison</th><th>cases</th>"
                "<th>reason</th></tr>"]
        out += [f"<tr><td>{e(fam)}</td><td>{e(cmp)}</td><td>{k}</td><td>{e(why)}</td></tr>"
                for fam, cmp, k, why in m.findings]
        out.append("</table></div>")
    if m.unverified:
        # for one case, a list of every decoration its family does not have is noise: folded
        head = (f"<details><summary>Unverified decorations ({len(m.unverified)})</summary>" if one
                else "<h2>Unverified decorations</h2>")
        out += [head, "<p>Named in the spec, passed by no case of this run:</p>", "<ul id='unverified'>"]
        out += [f"<li><code>{e(t)}</code>: {e(why)}</li>" for t, why in m.unverified]
        out.append("</ul>" + ("</details>" if one else ""))
    if m.excluded:
        out += ["<h2>Excluded by the spec</h2><table id='excluded'><tr><th>cases</th><th>reason</th></tr>"]
        out += [f"<tr><td>{k}</td><td>{e(why)}</td></tr>" for k, why in m.excluded] + ["</table>"]
    out += ["<h2>Cases<span id='filter'></span> <button id='all'>show all</button></h2>",
            "<p>Click a case for its per-layer, per-probe table.</p>",
            "<div class='scroll cases'><table id='cases'><thead><tr><th>case</th><th>candidate</th><th>status</th>"
            "<th>worst NMSE</th><th>worst err/tol</th><th>findings</th><th>first failure</th></tr></thead><tbody>"]
    for c in cs.itertuples():
        out.append(f"<tr data-case='{e(c.case_id)}' data-family='{e(c.family)}' data-candidate='{e(c.candidate)}' "
                   f"data-features='{e(' '.join(c.features))}'>"
                   f"<td><code>{e(c.case_id)}</code></td><td>{e(c.candidate)}</td>"
                   f"<td class='{e(c.status)}'>{e(c.status)}</td>"
                   f"<td>{_g(c.worst_nmse)}</td><td>{_g(c.worst_ratio)}</td><td>{c.findings or ''}</td>"
                   f"<td>{e(c.first_fail)}</td></tr>")
    out.append("</tbody></table></div><div id='detail'></div>")
    data = {"rows": details, "plots": plots or {}} if files is None else {"files": files}
    out.append(f"<p><small>{e(m.footer)}</small></p>")
    out.append(f"<script type='application/json' id='data'>{_script_json(data)}</script>")
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out)


def case_js(case_id: str, rows: list, plot: str | None) -> str:
    """A case's detail file (cases/*.js): it hands its rows to the page that loads it."""
    return f"window.caseData({_script_json(case_id)}, {_script_json({'rows': rows, 'plot': plot})});\n"


# ---------------------------------------------------------------- junit.xml
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _x(s) -> str:
    return _XML_BAD.sub("?", str(s))


def junit_xml(df: pd.DataFrame, meta: dict) -> str:
    cs = cases(df)
    info = meta.get("case_info", {})
    spec = meta.get("spec", {}).get("name", "matrix")
    root = ET.Element("testsuites", name=_x(f"conformance {spec}"))
    by_case = dict(tuple(df.groupby("case_id", sort=False))) if len(df) else {}
    for fam, group in (cs.groupby("family", sort=False) if len(cs) else []):
        suite = ET.SubElement(root, "testsuite", name=_x(f"conformance.{fam}"), tests=str(len(group)),
                              failures=str((group["status"].isin(FAILING) & (group["status"] != "error")).sum()),
                              errors=str((group["status"] == "error").sum()),
                              skipped=str((~group["status"].isin(("pass",) + FAILING)).sum()))
        for c in group.itertuples():
            t = info.get(c.case_id, {}).get("timings", {}).get("case_s", 0.0)
            tc = ET.SubElement(suite, "testcase", classname=_x(f"conformance.{fam}"), name=_x(c.case_id),
                               time=f"{t:.3f}")
            rows = by_case[c.case_id]
            if c.status in FAILING:
                bad = rows[rows["status"].isin(FAILING)]
                body = "\n".join(f"{r.candidate} vs {r.reference} L{r.layer} {r.probe}: {r.status}: {r.reason}"
                                 for r in bad.itertuples())
                ET.SubElement(tc, "error" if c.status == "error" else "failure", message=_x(c.first_fail)).text = _x(body)
            elif c.status != "pass":
                ET.SubElement(tc, "skipped", message=_x(f"{c.status}: {rows['reason'].iloc[0]}"))
            if c.findings:
                fd = rows[rows["status"] == "finding"]
                ET.SubElement(tc, "system-out").text = _x("\n".join(
                    f"finding: {r.candidate} vs {r.reference} L{r.layer} {r.probe}: {r.reason}" for r in fd.itertuples()))
    ET.indent(root)
    return "<?xml version='1.0' encoding='utf-8'?>\n" + ET.tostring(root, encoding="unicode") + "\n"


# ---------------------------------------------------------------- plots
def plot_name(case_id: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", case_id)[:120]
    return f"{slug}-{hashlib.sha1(case_id.encode()).hexdigest()[:8]}.png"


_PLOTTED = ["case_id", "candidate", "reference", "layer", "probe", "status", "nmse", "tol_nmse"]


def plot_case(rows, path: Path) -> None:
    """NMSE against layer and probe, one line per comparison, failing points
    marked, the tolerance dashed. Drawing costs more than a warm case, so a PNG
    is kept in the cache under the hash of exactly what it shows (and of this
    file) and copied from there when the same rows come again."""

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if df.empty or "nmse" not in df:
        return
    shown = df.reindex(columns=_PLOTTED).to_json(orient="values", double_precision=15)
    k = cache.key("plot", cache.source_hash(__file__), shown)
    hit = cache.cache_dir() / "plots" / f"{k}.png"
    if not hit.exists():
        with atomic.atomic_path(hit, suffix=".png") as tmp:  # workers never copy half a file
            _draw(df, tmp)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(hit, path)


def _draw(df: pd.DataFrame, path: Path):
    df = df[df["nmse"].notna()]
    # x: dataflow order -- embeddings, each layer's probes, then the model's outputs
    order = {p: i for i, p in enumerate(LAYER_PROBES)}
    key = lambda l, p: (0, 0, 0) if p == "embeddings" else ((1, l, order.get(p, 99)) if l >= 0 else (2, 0, 0))  # noqa: E731
    labels = sorted({(key(l, p), f"L{l} {p}" if l >= 0 else p) for l, p in zip(df["layer"], df["probe"])})
    xs = {lab: i for i, (_, lab) in enumerate(labels)}
    # a label per probe while the layers are few; at real depth one per layer (at its first
    # probe; every probe keeps its tick): 30 layers' 450 rotated labels were most of a
    # plot's cost (a 135M-class file: set_xticks + savefig 72 s of 94 under load) and made a
    # 72-inch-wide picture nobody reads label by label
    layers = sorted({k[1] for k, _ in labels if k[0] == 1})
    per_layer = len(layers) > len(LAYER_PROBES) // 2
    shown = ({lab: x for x, (k, lab) in enumerate(labels) if k[0] != 1 or x == 0 or labels[x - 1][0][:2] != k[:2]}
             if per_layer else xs)
    width = max(6.0, 0.16 * len(shown) * (3 if per_layer else 1))
    fig = matplotlib_figure.Figure(figsize=(width, 3.4), dpi=90)
    backend_agg.FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # exact agreement (NMSE 0) is drawn on a floor below the smallest error, not at 1e-300
    pos = df["nmse"][df["nmse"] > 0]
    floor = float(pos.min()) / 10 if len(pos) else 1e-20
    df = df.assign(_x=[xs[f"L{l} {p}" if l >= 0 else p] for l, p in zip(df["layer"], df["probe"])],
                   _y=df["nmse"].clip(lower=floor).replace(math.inf, 1e3)).sort_values("_x", kind="stable")
    for (cand, ref), g in df.groupby(["candidate", "reference"], sort=False):
        line, = ax.plot(g["_x"], g["_y"], marker=".", lw=1, label=f"{cand} vs {ref}")
        bad = g[g["status"].isin(FAILING)]
        ax.plot(bad["_x"], bad["_y"], "x", color="#d73027", ms=7)
        if "tol_nmse" in g and cand not in references.names():
            ax.step(g["_x"], g["tol_nmse"], where="mid", ls="--", lw=0.8, color=line.get_color(), alpha=0.6)
    ax.set_yscale("log")
    ax.set_ylabel("NMSE (dashed: tolerance)")
    if per_layer:
        ax.set_xticks(list(shown.values()), [lab.split(" ")[0] if lab.startswith("L") else lab for lab in shown],
                      rotation=90, fontsize=6)
        ax.set_xticks(range(len(xs)), minor=True)
    else:
        ax.set_xticks(range(len(xs)), list(xs), rotation=90, fontsize=6)
    ax.set_title(str(df["case_id"].iloc[0]) if "case_id" in df and len(df) else "", fontsize=7)
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:.0e}"))  # plain text: mathtext parsing is slow
    ax.legend(fontsize=6, loc="upper left")
    # fixed margins: tight_layout measures every label and doubled the cost of a plot. The left
    # one in inches (tick labels "1e-10" plus the axis label), not a fraction of a width that
    # grows with the probes: at 6 in, 10% clipped the y-axis label
    fig.subplots_adjust(left=0.95 / width, right=1 - 0.06 / width, top=0.92, bottom=0.3)
    # a 64-colour palette (Pillow, matplotlib's own dependency): a few line colours and their
    # anti-aliasing need no more, and report.html embeds every plot: 51 -> ~19 KB each (+0.05 s)

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=64).save(path, format="PNG")
    return fig


# ---------------------------------------------------------------- feature map
MAP_ORDER = ("unguarded", "missing", "error", "fail", "finding", "pass", "not-implemented", "not-exposed", "skipped")
def map_cols() -> tuple:
    """The feature map's columns: the candidate against each reference, then each
    pair of references (the later one judged against the earlier, as a case's rows are)."""
    refs = references.names()
    return (tuple(("candidate", r) for r in refs)
            + tuple((refs[j], refs[i]) for i in range(len(refs)) for j in range(i + 1, len(refs))))


def feature_map(df: pd.DataFrame) -> str:
    """Every spec decoration x the families that exercise it x the references:
    the status of the comparisons (a finding shows as one here) and the worst
    NMSE on attn_out; a decoration no case exercises is listed as unverified,
    and so is one whose cases never passed against a reference."""
    cs = cases(df)
    rank = {s: i for i, s in enumerate(MAP_ORDER)}
    cells: dict = {}
    if len(df):
        # each case's candidate (impl, or another engine) is the "candidate" column
        df = df.assign(candidate=df["candidate"].where(~is_candidate(df), "candidate"))
        d = df.assign(_r=df["status"].map(rank).fillna(len(MAP_ORDER)),
                      _ao=pd.to_numeric(df["nmse"], errors="coerce").where(df["probe"] == "attn_out"))
        pair = d.groupby(["case_id", "candidate", "reference"], sort=False).agg(r=("_r", "min"), ao=("_ao", "max"))
        tags = cs[["case_id", "family", "features"]].explode("features").dropna(subset=["features"])
        m = tags.merge(pair.reset_index(), on="case_id")
        for (tag, fam, cand, ref), g in m.groupby(["features", "family", "candidate", "reference"]):
            cells[(tag, fam, cand, ref)] = (MAP_ORDER[int(g["r"].min())] if g["r"].min() < len(MAP_ORDER) else "?",
                                            g["ao"].max())
    fams_of: dict = {}
    for tag, fam, *_ in cells:
        fams_of.setdefault(tag, set()).add(fam)
    named = sorted(set(cs["candidate"])) if len(cs) else ["impl"]
    who = named[0] if len(named) == 1 else "candidate"
    # the header names the columns the cells are read in (map_cols: every reference, hf_cached
    # included), so a fourth reference cannot shift the cells under another pair's name
    head = [f"{who if cand == 'candidate' else cand} vs {ref}" for cand, ref in map_cols()]
    lines = ["status of the comparisons of the cases with the feature; NMSE: the worst on attn_out", "",
             f"{'feature':<20} {'family':<14} " + " ".join(f"{h:<24}" for h in head)]
    verified, unver = [], []
    for tag in list(SPEC_DECORATIONS) + sorted(set(fams_of) - set(SPEC_DECORATIONS)):
        if tag not in fams_of:
            unver.append(tag)
            why = REFERENCE_GAPS.get(tag, "no case in this run exercises it")
            lines.append(f"{tag:<20} {'-':<14} unverified: {why}")
            continue
        ok = False
        for n, fam in enumerate(sorted(fams_of[tag])):
            row = []
            for cand, ref in map_cols():
                st, ao = cells.get((tag, fam, cand, ref), ("-", math.nan))
                ok |= cand == "candidate" and st == "pass"
                row.append(st if st == "-" else f"{st} {_g(ao) if ao == ao else '(no attn_out)'}")
            lines.append(f"{tag if n == 0 else '':<20} {fam:<14} " + " ".join(f"{c:<24}" for c in row))
        (verified if ok else unver).append(tag)
        if not ok:
            lines.append(f"{'':<20} {'':<14} unverified: {who} passed against no reference in these cases")
    lines += ["", f"verified ({who} passes against a reference): {len(verified)} of {len(verified) + len(unver)}; "
              f"unverified: {', '.join(unver) or 'none'}"]
    return "\n".join(lines)


# ---------------------------------------------------------------- all of them
def write_all(d: Path, df: pd.DataFrame, meta: dict) -> None:
    d = Path(d)
    plots = {cid: d / "plots" / plot_name(cid) for cid in dict.fromkeys(df["case_id"])} if len(df) else {}
    # embedded as data URIs: a report.html copied or mailed on its own keeps its plots
    plots = {k: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode("ascii")
             for k, p in plots.items() if p.exists()}
    atomic.write_text(d / "summary.md", summary_md(df, meta))
    details = case_details(df)
    size = len(_script_json(details)) + sum(len(v) for v in plots.values())
    if size <= EMBED_LIMIT:
        atomic.write_text(d / "report.html", report_html(df, meta, plots))
    else:  # each case's detail beside the page, loaded when the case is opened
        files = {}
        for cid, rows in details.items():
            files[cid] = case_file(cid)
            atomic.write_text(d / files[cid], case_js(cid, rows, plots.get(cid)))
        atomic.write_text(d / "report.html", report_html(df, meta, None, files))
    atomic.write_text(d / "junit.xml", junit_xml(df, meta))
