"""``conformance diff BASE NEW``: what changed between two runs, per feature.

New failures, fixed cases, and the cases whose worst error grew by more than
the policy's ``[regression] factor``; each case is counted under every
feature it has, and the features whose every case regressed are named as the
likely cause. Markdown on stdout.

A case of BASE that NEW did not run is *missing*: listed apart, never called a
regression -- nothing about it got worse; it was not looked at. Exit status: 1
on a regression (a new failure, or grown error); 0 otherwise, missing cases
included, because judging a part of a matrix (a shard, a smoke run, one family)
against a full baseline is an ordinary use. ``--fail-missing`` makes missing
cases exit 1 too: for CI, whose NEW runs the whole spec the baseline ran, a
case gone from it is coverage lost unnoticed (``.ci/run`` passes it).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
import json

from ..errors import UsageError
from ..report import read_rows
from ..views import _err, is_candidate, cases, FAILING, feature_order
from ..versions import ENGINE_PACKAGES, PACKAGES
from ..views import _g, _md
from ..policy import load_policy
from ..report import check_writable

from harness.lazy import lazy

pd = lazy("pandas")  # bad input is refused, `conformance list` runs, without it (harness/lazy.py)

# Below this fraction of its tolerance an error is rounding noise: growth is
# measured from here, so 1e-30 -> 1e-28 in float64 is not a "100x regression".
NOISE = 1e-4
# ... and below this fraction for a comparison with ggml's activation rounding emulated
# (cmp_dtype ggml_<act>): what is left there is float32 summation order, which decides
# whether a value lands on one side of a quantization step or the other -- a discrete
# flip of one q8 step in one block, NMSE ~1e-9..1e-7 of the row, that changes with the
# BLAS kernel numpy picks for the CPU at run time. Measured: deepseek_v3 Q4_K_M L0
# attn_out 7.6e-10 on the baseline's machine, 5.7e-9 on another (bound 1e-5).
NOISE_EMULATED = 1e-2


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two run directories: new failures, fixes, per-feature error growth")
    p.add_argument("base", metavar="BASE", help="the baseline run directory (e.g. fixtures/baselines/default)")
    p.add_argument("new", metavar="NEW", help="the run directory to judge")
    p.add_argument("--policy", metavar="TOML", help="tolerance policy with [regression] factor (default fixtures/tolerance.toml)")
    p.add_argument("--factor", type=float, help="override the policy's growth factor")
    p.add_argument("--md", metavar="FILE", help="also write the markdown to FILE")
    p.add_argument("--fail-missing", action="store_true",
                   help="exit 1 when a case of BASE was not run in NEW (default: listed, exit 0 unless a regression)")
    p.add_argument("--candidate", metavar="NAME",
                   help="compare only the cases judging this candidate (default: every case, each its own)")
    p.set_defaults(fn=cmd_diff)


def _rows(d: str) -> pd.DataFrame:
    if not Path(d).is_dir():
        raise UsageError(f"{d!r} is not a run directory")
    try:
        return read_rows(Path(d))
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None


def _worst(df: pd.DataFrame) -> dict:
    """``{(case_id, reference): (err, floor, where)}``: the worst judged error of
    each case's candidate (impl, or another engine)."""
    impl = df[is_candidate(df)].assign(_e=lambda x: pd.to_numeric(_err(x), errors="coerce"))
    impl = impl[impl["_e"].notna()]
    out = {}
    for (cid, ref), g in impl.groupby(["case_id", "reference"], sort=False):
        r = g.loc[g["_e"].idxmax()]
        tol = pd.to_numeric(g.get("tol_nmse"), errors="coerce").min() if "tol_nmse" in g else math.nan
        emulated = "cmp_dtype" in g and g["cmp_dtype"].astype(str).str.startswith("ggml_").any()
        floor = (NOISE_EMULATED if emulated else NOISE) * tol if tol == tol and tol > 0 else 0.0
        where = f"L{r['layer']} {r['probe']}" if r["layer"] >= 0 else r["probe"]
        out[(cid, ref)] = (float(r["_e"]), floor, where)
    return out


def _only(df: pd.DataFrame, candidate: str, where: str) -> pd.DataFrame:
    """The rows of the cases of ``df`` that judge ``candidate``."""
    cs = cases(df)
    keep = set(cs.loc[cs["candidate"] == candidate, "case_id"])
    if not keep:
        have = sorted(set(cs["candidate"])) or ["none"]
        raise UsageError(f"{where} has no case judging candidate {candidate!r}; its candidates: {', '.join(have)}")
    return df[df["case_id"].isin(keep)]


def compare(base: pd.DataFrame, new: pd.DataFrame, factor: float) -> dict:
    bc, nc = cases(base).set_index("case_id"), cases(new).set_index("case_id")
    feats = {**bc["features"].to_dict(), **nc["features"].to_dict()}
    failing = lambda c, cid: cid in c.index and c.at[cid, "status"] in FAILING  # noqa: E731
    new_fail = [cid for cid in nc.index if failing(nc, cid) and not failing(bc, cid)]
    fixed = [cid for cid in bc.index if failing(bc, cid) and cid in nc.index and not failing(nc, cid)]
    missing = [cid for cid in bc.index if cid not in nc.index]
    added = [cid for cid in nc.index if cid not in bc.index]
    bw, nw = _worst(base), _worst(new)
    grew = []
    for key, (e, floor, where) in nw.items():
        if key in bw and key[0] not in new_fail:
            b = bw[key][0]
            g = e / max(b, floor) if max(b, floor) > 0 else (math.inf if e > 0 else 1.0)
            if g > factor and not (math.isinf(e) and math.isinf(b)):
                grew.append({"case_id": key[0], "reference": key[1], "base": b, "new": e, "growth": g, "where": where})
    regressed = set(new_fail) | {g["case_id"] for g in grew}  # missing is not a regression: it was not run

    per = {}
    for f in feature_order({t for ts in feats.values() for t in ts}):
        have = [cid for cid, ts in feats.items() if f in ts and cid in nc.index]  # the cases judged
        per[f] = dict(cases=len(have), new_failures=sum(c in new_fail for c in have),
                      grew=len({g["case_id"] for g in grew if f in feats[g["case_id"]]}),
                      missing=sum(f in feats[c] for c in missing), fixed=sum(c in fixed for c in have),
                      regressed=sum(c in regressed for c in have))
    hit = {f: p for f, p in per.items() if p["regressed"]}
    # The cause is most likely a feature ALL of whose cases regressed; among several,
    # the one with the fewest cases is the most specific.
    implicated = sorted((f for f, p in hit.items() if p["regressed"] == p["cases"]), key=lambda f: per[f]["cases"])
    if not implicated and hit:
        best = max(p["regressed"] / p["cases"] for p in hit.values())
        implicated = [f for f, p in hit.items() if p["regressed"] / p["cases"] == best]
    return dict(new_failures=new_fail, fixed=fixed, missing=missing, added=added, grew=grew, per_feature=per,
                implicated=implicated, regressed=sorted(regressed), new_cases=nc, base_cases=bc, factor=factor)


def version_changes(base: str, new: str) -> list[tuple[str, str | None, str | None]]:
    """``(package, base's version, new's)`` for every result-shaping package whose
    version the two runs recorded differently (meta.json ``versions``): a verdict that
    moved with them may be the release's, not the code's. A judged engine's package
    installed for one run and absent from the other is no change: it shapes only the
    rows of a candidate that runs on it, and such a candidate cannot run without it
    (the rows say so); two different versions of it are one."""

    def read(d):
        try:
            return json.loads((Path(d) / "meta.json").read_text()).get("versions") or {}
        except (OSError, ValueError):
            return {}

    vb, vn = read(base), read(new)
    if not vb or not vn:
        return []
    return [(p, vb.get(p), vn.get(p)) for p in (*PACKAGES, "python", "llama_cpp_kernels")
            if p in vb and p in vn and vb.get(p) != vn.get(p)  # a package one run did not record: unknown
            and not (p in ENGINE_PACKAGES and None in (vb.get(p), vn.get(p)))]


def markdown(res: dict, base: str, new: str, changed: list | None = None) -> str:
    reg = bool(res["regressed"])
    nc = res["new_cases"]
    miss = f" ({len(res['missing'])} cases of base missing: not run in new)" if res["missing"] else ""
    # the same code on another release of a reference is not a regression of the code:
    # said first, and every changed row is marked as moved with the versions
    title = ("CHANGED WITH THE VERSIONS" if changed else "REGRESSION") if reg else "no regression"
    lines = [f"# Conformance diff: {title}{miss}", ""]
    if changed:
        pairs = ", ".join(f"{p.replace('_', '-')} {b or 'absent'} → {n or 'absent'}" for p, b, n in changed)
        lines += [f"**Versions changed between the runs: {pairs}.** The changes below are marked "
                  "\"versions changed\": a result that moved with a release, not a regression of the code on the same "
                  "versions. `conformance upstream PACKAGE A..B` names the release that moved each one.", ""]
    lines += [f"base `{_md(base)}` → new `{_md(new)}` · growth factor {res['factor']:g}", "",
             f"- new failures: {len(res['new_failures'])}", f"- error grew > {res['factor']:g}x: {len(res['grew'])}",
             f"- fixed: {len(res['fixed'])}",
             f"- missing (in base, not run in new; not a regression): {len(res['missing'])}",
             f"- new cases (not in base): {len(res['added'])}"]
    if res["implicated"]:
        per = res["per_feature"]
        lines += ["", "## Implicated feature" + ("s" if len(res["implicated"]) > 1 else ""), ""]
        lines += [f"- `{f}`: {per[f]['regressed']} of its {per[f]['cases']} cases regressed" for f in res["implicated"]]
    rows = [(f, p) for f, p in res["per_feature"].items() if p["regressed"] or p["fixed"]]
    if rows:
        lines += ["", "## Per feature", "", "| feature | cases | new failures | grew | missing | fixed |",
                  "|---|---|---|---|---|---|"]
        rows.sort(key=lambda fp: (-fp[1]["regressed"] / fp[1]["cases"], fp[1]["cases"]))
        for f, p in rows:
            lines.append(f"| {f} | {p['cases']} | {p['new_failures']} | {p['grew']} | {p['missing']} | {p['fixed']} |")
    if res["new_failures"]:
        head = "## New failures (versions changed)" if changed else "## New failures"
        lines += ["", head, "", "| case | first failure |", "|---|---|"]
        lines += [f"| `{_md(c)}` | {_md(nc.at[c, 'first_fail'])} |" for c in res["new_failures"][:100]]
    if res["grew"]:
        lines += ["", f"## Error grew by more than {res['factor']:g}x" + (" (versions changed)" if changed else ""), "",
                  "| case | vs | worst error base → new | growth | where (new) |", "|---|---|---|---|---|"]
        for g in sorted(res["grew"], key=lambda g: -g["growth"])[:100]:
            lines.append(f"| `{_md(g['case_id'])}` | {_md(g['reference'])} | {_g(g['base'])} → {_g(g['new'])} | "
                         f"{_g(g['growth'])}x | {_md(g['where'])} |")
    for title, key in (("Fixed", "fixed"), ("Missing: in base, not run in new", "missing")):
        if res[key]:
            lines += ["", f"## {title}", ""] + [f"- `{_md(c)}`" for c in res[key][:100]]
    return "\n".join(lines) + "\n"


def cmd_diff(a) -> int:
    factor = a.factor if a.factor is not None else load_policy(a.policy).regression_factor
    if not factor > 1:
        raise UsageError(f"the growth factor must be > 1, got {factor}")
    if a.md:
        check_writable(Path(a.md), f"--md {a.md}", file=True)
    base, new = _rows(a.base), _rows(a.new)
    if a.candidate:
        base, new = (_only(df, a.candidate, d) for df, d in ((base, a.base), (new, a.new)))
    res = compare(base, new, factor)
    md = markdown(res, a.base, a.new, version_changes(a.base, a.new))
    sys.stdout.write(md)
    if a.md:
        Path(a.md).write_text(md)
    return 1 if res["regressed"] or (a.fail_missing and res["missing"]) else 0
