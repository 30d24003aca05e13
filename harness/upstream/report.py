"""The ``conformance upstream`` report: release by release, each change with its
kind, the reference's source hunks in the files the family reads, and a command
that reproduces it (markdown: report.md, and the weekly job's summary)."""

from __future__ import annotations

import json
import re
import shlex
from collections import defaultdict
from pathlib import Path

from . import KINDS, VERDICT_KINDS, family_of, sources
from .search import Bisector, Change
from .. import families
from ..fuzz import repro_command

EXAMPLES = 8  # rows shown per (release, family, kind); the rest counted (changes.json has them all)


def _fmt_value(v: tuple, nmse) -> str:
    st = v[0]
    if st in ("pass", "fail", "finding") and nmse is not None:
        try:
            return f"{st} (NMSE {float(nmse):.2g})"
        except (TypeError, ValueError):
            pass
    return st


def _md(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _llamacpp_files(tar: Path, family) -> list[str]:
    """The llama.cpp files a family's graph comes from: its arch's ``src/models/*.cpp``
    (``mamba`` -> mamba.cpp, mamba-base.cpp), the loader, the graph helpers and the
    recurrent memory, and ggml's CPU ops."""
    arch = re.sub(r"[^a-z0-9]", "", str(getattr(family, "gguf_arch", "") or family.name).lower())
    models = sources.list_sdist(tar, "vendor/llama.cpp/src/models/")
    own = [m for m in models if re.sub(r"[^a-z0-9]", "", Path(m).stem.lower()).startswith(arch) or
           (arch and Path(m).stem.lower().split("-")[0] == arch)]
    fixed = ["vendor/llama.cpp/src/llama-model.cpp", "vendor/llama.cpp/src/llama-graph.cpp",
             "vendor/llama.cpp/src/llama-memory-recurrent.cpp", "vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp"]
    return sorted(own) + fixed


def source_section(dist: str, fam_name: str, prev: str, rel: str, b: Bisector, pythons: dict, find_links) -> list[str]:
    """The hunks of ``dist``'s own source between ``prev`` and ``rel`` in the files
    ``fam_name`` reads (both releases' lists, joined)."""

    out = []
    if dist == "transformers":
        files = set()
        for r in (prev, rel):
            run = b.runs.get(r)
            files |= set(((run.sources if run else {}).get(fam_name) or {}).get("transformers", []))
        pa, pb = pythons.get(prev), pythons.get(rel)
        if pa is None or pb is None:
            return ["(the source of one release is not at hand: its environment was not made)"]
        read = lambda py, f: sources.read_installed(Path(py), f)  # noqa: E731
    else:
        ta, tb = sources.sdist(dist, prev, find_links), sources.sdist(dist, rel, find_links)
        if ta is None or tb is None:
            return [f"(the source distribution of {dist} {prev if ta is None else rel} could not be downloaded)"]
        files = set(_llamacpp_files(tb, families.get(fam_name)))
        pa, pb = ta, tb
        read = lambda tar, f: sources.read_sdist(Path(tar), f)  # noqa: E731
    shown = 0
    # the family's own modeling and configuration files first: where a release most often
    # changes what it computes; then the shared modules they import
    own = f"/models/{fam_name}/"
    for f in sorted(files, key=lambda f: (own not in f and "/src/models/" not in f, f)):
        old, new = read(pa, f), read(pb, f)
        if old == new:
            continue
        text, n = sources.hunks(old, new, f, prev, rel)
        more = f"\n... {n - sources.HUNK_LINES} more lines of this file's diff" if n > sources.HUNK_LINES else ""
        out += [f"`{f}`:", "", "```diff", text.rstrip("\n") + more, "```", ""]
        shown += 1
    if not shown:
        out.append(f"(none of the {len(files)} files {fam_name} reads changed between {prev} and {rel})")
    return out


def repro(dist: str, rel: str, case, pythons: dict, rng: str, harness: str | None = None,
          tree: str | None = None) -> list[str]:
    cmd = repro_command(case) if case is not None else "conformance matrix ..."
    py = pythons.get(rel)
    h = f" --harness {harness}" if harness else ""
    lines = [f"- `conformance upstream {dist} {rng} --family {case.family if case else '?'}{h}` (the bisection)"]
    if py is not None:
        env = f"PYTHONPATH={shlex.quote(tree)} " if tree else ""
        lines.append(f"- `{env}{shlex.quote(str(py))} -m harness {cmd.removeprefix('conformance ')}` "
                     f"(this case, on {rel}{', with the harness of ' + harness if harness else ''})")
    if not harness:
        lines.append(f"- `pip install {dist}=={rel} && {cmd}` (in an environment of your own)")
    return lines


def markdown(p, b: Bisector, changes: list[Change], meta: dict, base_check: dict | None, find_links=None) -> str:
    pythons = meta.get("pythons", {})
    rng = f"{p.releases[0]}..{p.releases[-1]}"
    verdict = [c for c in changes if c.kind in VERDICT_KINDS]
    drift = [c for c in changes if c.kind not in VERDICT_KINDS]
    by_kind = defaultdict(int)
    for c in changes:
        by_kind[c.kind] += 1
    fams = sorted({family_of(c) for c in p.case_ids})
    lines = [f"# conformance upstream: {p.dist} {rng}", "",
             f"**{len(verdict)} row{'s' * (len(verdict) != 1)} whose verdict a release changed"
             + (f", in {len({(c.release) for c in verdict})} release(s): " + ", ".join(sorted({c.release for c in verdict}))
                if verdict else "") + f"; {len(drift)} drifted inside the tolerance.**", "",
             f"- spec `{p.spec}`, {len(p.case_ids)} case(s) of {', '.join(fams)}",
             f"- releases in the range: {', '.join(p.releases)}",
             f"- harness: {meta.get('harness_rev') or 'this checkout'}",
             f"- calibrated (lock.txt): {p.calibrated or 'none'}"
             + ("" if p.calibrated in p.releases else " (outside the range: not run)"),
             "- runs made: " + ", ".join(f"{r} ({len(b.runs[r].cases)} cases)" for r in b.order),
             f"- wall: {meta.get('wall_s', '?')} s"]
    if by_kind:
        lines.append("- changes: " + ", ".join(f"{k} {by_kind[k]}" for k in KINDS if by_kind.get(k))
                     + "".join(f", {k} {n}" for k, n in by_kind.items() if k not in KINDS))
    for rel, err in meta.get("errors", {}).items():
        lines.append(f"- **{p.dist} {rel} could not be installed**: {_md(err)}")
    if base_check is not None:
        lines += ["", "## The calibrated release against the committed baseline", ""]
        if not base_check.get("cases"):
            lines.append("The baseline holds none of these cases.")
        else:
            lines.append(f"{base_check['cases']} case(s), {base_check['rows']} rows: the verdict differs on "
                         f"{base_check['status_differs']} row(s), the NMSE decade on {base_check['nmse_class_differs']} "
                         "(a difference here is the harness or this machine, not a release).")
            for ex in base_check.get("examples", []):
                lines.append(f"- `{_md(' '.join(ex))}`")
    by_rel: dict[str, list[Change]] = defaultdict(list)
    for c in changes:
        by_rel[c.release].append(c)
    for rel in p.releases:
        cs = by_rel.get(rel)
        if not cs:
            continue
        prev = cs[0].previous
        lines += ["", f"## {p.dist} {rel} (from {prev})", ""]
        brought = _brought(b, prev, rel)
        if brought:
            lines += [f"Packages the release's environment holds otherwise than the previous one's: {brought}", ""]
        per_fam: dict[str, list[Change]] = defaultdict(list)
        for c in cs:
            per_fam[family_of(c.key[0])].append(c)
        for fam, fcs in sorted(per_fam.items()):
            kinds = defaultdict(list)
            for c in fcs:
                kinds[c.kind].append(c)
            lines += [f"### {fam}: " + ", ".join(f"{k} ({len({c.key[0] for c in v})} cases, {len(v)} rows)"
                                                  for k, v in sorted(kinds.items(), key=lambda kv: KINDS.index(kv[0])
                                                                     if kv[0] in KINDS else 99)), ""]
            for kind, kcs in sorted(kinds.items(), key=lambda kv: KINDS.index(kv[0]) if kv[0] in KINDS else 99):
                lines += [f"**{kind}**", "", "| case | candidate vs reference | layer | probe | before | after |",
                          "|---|---|---|---|---|---|"]
                # a case's own error row first: it says why its other rows are gone
                kcs = sorted(kcs, key=lambda c: (c.after[0] not in ("error", "refused"), str(c.key)))
                for c in kcs[:EXAMPLES]:
                    cid, cand, ref, layer, probe = c.key
                    before = _fmt_value(c.before, c.nmse_before)
                    after = _fmt_value(c.after, c.nmse_after)
                    why = b.runs[rel].reason(c.key) if c.after[0] in ("error", "refused", "not-exposed") else ""
                    lines.append(f"| `{_md(cid)}` | {_md(cand)} vs {_md(ref)} | {layer} | {_md(probe)} | {before} | "
                                 f"{after}{(': ' + _md(why[:300])) if why else ''} |")
                if len(kcs) > EXAMPLES:
                    lines.append(f"| ... {len(kcs) - EXAMPLES} more rows (changes.json) | | | | | |")
                lines.append("")
            first = p.cases.get(sorted({c.key[0] for c in fcs})[0])
            lines += ["Reproduce:", ""] + repro(p.dist, rel, first, pythons, f"{prev}..{rel}", meta.get("harness_rev"),
                                                meta.get("harness_tree")) + [""]
            lines += [f"The {p.dist} source {fam} reads, {prev} -> {rel}:", ""]
            lines += source_section(p.dist, fam, prev, rel, b, pythons, find_links)
    if not changes:
        lines += ["", f"No row's verdict or NMSE decade differs between {', '.join(p.anchors)}."]
    return "\n".join(lines) + "\n"


def _brought(b: Bisector, prev: str, rel: str) -> str:
    a, c = b.runs.get(prev), b.runs.get(rel)
    if a is None or c is None:
        return ""
    va, vc = a.versions or {}, c.versions or {}
    diff = [f"{k} {va.get(k) or 'absent'} -> {vc.get(k) or 'absent'}" for k in sorted(set(va) | set(vc))
            if k not in ("git_commit",) and va.get(k) != vc.get(k)]
    return ", ".join(diff)


def changes_json(changes: list[Change]) -> str:
    return json.dumps([{"case_id": c.key[0], "candidate": c.key[1], "reference": c.key[2], "layer": c.key[3],
                        "probe": c.key[4], "release": c.release, "previous": c.previous, "kind": c.kind,
                        "before": list(c.before), "after": list(c.after), "nmse_before": c.nmse_before,
                        "nmse_after": c.nmse_after} for c in changes], indent=1, default=str)
