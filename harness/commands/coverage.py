"""``conformance coverage``: every config key a family's HF config declares, and what
varies it -- a matrix case or the fuzz space, with the values -- or why it cannot
change the attention half (harness/coverage.py; issue 39).

The keys nothing varies and nothing reasons yet are listed, per family, in
fixtures/coverage_open.json: the test suite fails when a family gains a key that is in
neither (a new field transformers added, a key a new family declares), and when a key
listed there has since been varied or reasoned (the list only shrinks).
``--update-open`` rewrites it from the tables.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError
from .. import coverage, families
from ..coverage import summary

OPEN = Path(__file__).resolve().parents[2] / "fixtures" / "coverage_open.json"


def register(sub) -> None:
    p = sub.add_parser("coverage", help="every config key of each family: what varies it (a matrix case, the fuzz) "
                                        "or why it cannot change the attention half")
    p.add_argument("--family", action="append", help="only this family (repeatable)")
    p.add_argument("--uncovered", action="store_true", help="list only the keys nothing varies or reasons")
    p.add_argument("--no-fuzz", action="store_true", help="leave the fuzz spaces out (matrix cases alone)")
    p.add_argument("--md", metavar="FILE", help="also write the report as markdown to FILE")
    p.add_argument("--update-open", action="store_true",
                   help=f"rewrite {OPEN.relative_to(OPEN.parents[1])} with today's uncovered keys")
    p.set_defaults(fn=cmd_coverage)


def tables(names: list[str], fuzz: bool = True) -> dict:
    return {n: coverage.table(families.get(n), fuzz=fuzz) for n in names}


def open_keys() -> dict[str, list[str]]:
    try:
        return json.loads(OPEN.read_text())
    except FileNotFoundError:
        return {}


def _values(vals: set) -> str:
    v = sorted(vals)
    return ", ".join(v[:6]) + (f" (+{len(v) - 6})" if len(v) > 6 else "")


def markdown(tabs: dict, only_uncovered: bool = False) -> str:
    lines = ["# Config key coverage", "",
             "Each family's keys (its HF config class's fields; `rope_parameters` one level down), where "
             "transformers reads them, and what varies each: a matrix spec (`default` runs in CI) or the fuzz "
             "space, with the values; or why it cannot change the attention half (fixtures/coverage.toml).", "",
             "| family | keys | varied | reasoned | uncovered |", "|---|---|---|---|---|"]
    total = {"varied": 0, "reasoned": 0, "uncovered": 0}
    for name, keys in tabs.items():
        s = summary(keys)
        for k in total:
            total[k] += s[k]
        lines.append(f"| {name} | {len(keys)} | {s['varied']} | {s['reasoned']} | {s['uncovered']} |")
    n = sum(total.values())
    lines += ["", f"**{n} keys: varied {total['varied']}, reasoned {total['reasoned']}, uncovered "
                  f"{total['uncovered']} ({100 * (n - total['uncovered']) / max(n, 1):.1f}% covered).**", ""]
    for name, keys in tabs.items():
        rows = [k for k in keys.values() if not only_uncovered or k.status == "uncovered"]
        if not rows:
            continue
        lines += [f"## {name}", "", "| key | read by | status | varied by (values) / reason |", "|---|---|---|---|"]
        for k in rows:
            how = ("; ".join(f"{w}: {_values(v)}" for w, v in sorted(k.varied.items())) if k.varied
                   else (k.reason or "-"))
            lines.append(f"| `{k.name}` | {', '.join(k.read_by) or 'neither'} | {k.status} | {how.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def cmd_coverage(a) -> int:
    names = list(families.registry())
    for f in a.family or ():
        if f not in names:
            raise UsageError(f"--family {f!r}: no such family; see `conformance list`")
    if a.update_open and (a.family or a.no_fuzz):
        raise UsageError("--update-open rewrites the whole list: give no --family and no --no-fuzz")
    names = a.family or names
    tabs = tables(names, fuzz=not a.no_fuzz)
    md = markdown(tabs, a.uncovered)
    print(md)
    if a.md:
        Path(a.md).write_text(md + "\n")
    if a.update_open:
        got = {n: sorted(k.name for k in keys.values() if k.status == "uncovered") for n, keys in tabs.items()}
        OPEN.write_text(json.dumps({n: v for n, v in got.items() if v}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {OPEN}")
    return 0
