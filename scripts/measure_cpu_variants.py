"""Measure the llama.cpp comparisons on every set of ggml CPU kernels, and bound accordingly.

ggml picks its CPU kernels when it is built (scripts/build_llamacpp.sh: avx2 --
the default, x86-64-v3 --, avx512 and sse42: no AVX / FMA / F16C, fp16 converted
in software), and every llama.cpp number the harness compares against rounds
the way those kernels round. A finding's ``max_nmse`` or a tolerance measured
with one set must hold with the others. This script runs a matrix spec (default:
the default matrix's cases that include llama.cpp) once per kernel set -- each
set's llama-cpp-python installed into its own folder and put first on
PYTHONPATH of the run, so nothing else changes -- and reports, per set:

- the case statuses;
- per finding (fixtures/tolerance.toml, by its number): the largest NMSE of the
  rows it matches (whatever its bound), next to its max_nmse;
- per comparison pair and probe: the worst error relative to its tolerance.

    .venv/bin/python scripts/measure_cpu_variants.py [--variants avx2,avx512,amx,sse42] [--spec S] [-j 2] [--out DIR]

A set this CPU cannot execute (scripts/build_llamacpp.sh's flags it lacks: AVX512-BF16,
AMX) is skipped and named.

Writes DIR/cpu_variants.md (and each set's run directory). The numbers the
policy quotes come from its last run; the README says when that was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# what each kernel set needs of an x86 CPU (/proc/cpuinfo flags, scripts/build_llamacpp.sh's
# compiler flags): a set the CPU lacks one of dies with SIGILL on its first such instruction
NEEDS = {
    "sse42": ("sse4_2",),
    "avx2": ("avx2", "fma", "f16c", "bmi2"),
    "avx512": ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi",
               "avx512_vnni", "avx512_bf16"),
    "amx": ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi",
            "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"),
    "native": (),
}


def cpu_lacks(variant: str) -> list[str]:
    """The CPU flags ``variant`` needs that this machine's CPU does not report
    (none off Linux/x86, where build_llamacpp.sh builds ggml's own defaults)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return []
    have = set(line.split(":", 1)[1].split())
    return [f for f in NEEDS[variant] if f not in have]


def install(variant: str, base: Path) -> Path:
    site = base / f"site-{variant}"
    marker = site / ".kernels"
    if marker.exists() and marker.read_text() == variant:
        return site
    whl = subprocess.run(["bash", str(ROOT / "scripts" / "build_llamacpp.sh"), variant], check=True,
                         capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable)).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--upgrade", "--target", str(site), whl], check=True)
    marker.write_text(variant)
    return site


def llamacpp_spec(spec_path: Path, out: Path) -> Path:
    """The spec with every group restricted to cases that include llama.cpp."""
    text = spec_path.read_text()
    data = tomllib.loads(text)
    groups = data.get("group") or [{}]
    keep = []
    for g in groups:
        refs = g.get("references", data.get("references", ["hf"]))
        refs = [r for r in (refs if isinstance(refs, list) else [refs]) if r in ("llamacpp", "all")]
        if refs:
            keep.append({**g, "references": refs})
    lines = [f'name = "{data.get("name", "spec")}-llamacpp"']
    top = {k: v for k, v in data.items() if k not in ("group", "exclude", "name", "description", "references")}
    for k, v in top.items():
        lines.append(f"{k} = {json.dumps(v)}")
    for g in keep:
        lines.append("[[group]]")
        for k, v in g.items():
            lines.append(f"{k} = {_toml(v)}")
    for ex in data.get("exclude", []):
        lines.append("[[exclude]]")
        for k, v in ex.items():
            lines.append(f"{k} = {_toml(v)}")
    p = out / "spec-llamacpp.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def _toml(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def analyse(run_dir: Path) -> dict:
    import pandas as pd

    from harness.case import Case
    from harness.families import get
    from harness.policy import load_policy

    pol = load_policy()
    rows = pd.read_parquet(run_dir / "rows.parquet")
    run = json.loads((run_dir / "run.json").read_text())
    configs = {}
    for c in (Case.from_dict(d) for d in run["cases"]):
        configs[c.case_id()] = get(c.family).make_config(dict(c.overrides))
    lc = rows[(rows["candidate"] == "llamacpp") | (rows["reference"] == "llamacpp")]
    lc = lc[pd.to_numeric(lc.get("nmse"), errors="coerce").notna()]
    per_finding: dict[int, float] = {}
    for r in lc[lc["status"].isin(("fail", "finding", "unguarded"))].itertuples():
        reason = pol.finding(r.family, r.candidate, r.reference, r.probe, r.layer_kind, configs[r.case_id],
                             layer=None if r.layer < 0 else int(r.layer), nmse=float(r.nmse), bounded=False,
                             family_values=get(r.family).finding_values(configs[r.case_id]))
        if reason:
            n = int(reason.split("#", 1)[1].split(":", 1)[0])
            per_finding[n] = max(per_finding.get(n, 0.0), float(r.nmse))
    judged = lc[lc["status"].isin(("pass", "fail"))]
    ratio = judged.groupby(["candidate", "reference", "probe"])["err_ratio"].max().to_dict()
    statuses = rows.drop_duplicates("case_id").shape[0]
    from harness.views import cases

    return {"cases": statuses, "case_status": cases(rows)["status"].value_counts().to_dict(),
            "findings": per_finding, "worst_ratio": {"/".join(k): float(v) for k, v in ratio.items()},
            "kernels": json.loads((run_dir / "meta.json").read_text())["versions"].get("llama_cpp_kernels")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="avx2,avx512,sse42")
    ap.add_argument("--spec", default=str(ROOT / "fixtures" / "matrix" / "default.toml"))
    ap.add_argument("--all-cases", action="store_true", help="run the whole spec, not only its llama.cpp cases")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / ".cache" / "cpu-variants"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = Path(a.spec) if a.all_cases else llamacpp_spec(Path(a.spec), out)
    results = {}
    for v in [x.strip() for x in a.variants.split(",") if x.strip()]:
        if v not in NEEDS:
            print(f"measure_cpu_variants.py: unknown kernel set {v!r}; valid: {', '.join(NEEDS)}", file=sys.stderr)
            return 2
        lacks = cpu_lacks(v)
        if lacks:
            print(f"== {v}: skipped, this CPU cannot execute it (lacks {', '.join(lacks)})", file=sys.stderr)
            continue
        site = install(v, out)
        rd = out / f"run-{v}"
        if not (rd / "rows.parquet").exists():
            if rd.exists():
                cmd = ["matrix", "--resume", str(rd), "-j", str(a.jobs)]
            else:
                cmd = ["matrix", str(spec), "--out", str(rd), "-j", str(a.jobs)]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]))
            print(f"== {v}: conformance {' '.join(cmd)}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "harness.cli", *cmd], env=env, cwd=ROOT)
        results[v] = analyse(rd)
    pol = tomllib.loads((ROOT / "fixtures" / "tolerance.toml").read_text())["finding"]
    lines = ["# llama.cpp comparisons per set of ggml CPU kernels", ""]
    for v, r in results.items():
        lines.append(f"- **{v}**: {r['kernels']}; cases: {r['case_status']}")
    lines += ["", "## Findings: largest NMSE matched, per kernel set", "",
              "| # | family | pair | max_nmse | " + " | ".join(results) + " |",
              "|---|---|---|---|" + "---|" * len(results)]
    for n in sorted({n for r in results.values() for n in r["findings"]}):
        f = pol[n - 1]
        vals = " | ".join(f"{r['findings'].get(n, float('nan')):.3g}" for r in results.values())
        lines.append(f"| {n} | {f['family']} | {f['candidate']} vs {f['reference']} | {f.get('max_nmse', '-')} | {vals} |")
    lines += ["", "## Worst error / tolerance per pair and probe (judged rows)", "",
              "| pair / probe | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for k in sorted({k for r in results.values() for k in r["worst_ratio"]}):
        lines.append(f"| {k} | " + " | ".join(f"{r['worst_ratio'].get(k, float('nan')):.3g}" for r in results.values())
                     + " |")
    (out / "cpu_variants.md").write_text("\n".join(lines) + "\n")
    (out / "cpu_variants.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
