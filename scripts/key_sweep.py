"""Set one config key to one value in every family that declares it, run each family's
case three-way, and list the families whose rows then fail (issue 39: keys no case
varies). A survey, not a gate: a family listed here is a divergence to resolve -- a
harness bug (the GGUF export or impl ignores the key), or a finding of the references
with both lines -- before the key joins the fuzz.

    .venv/bin/python scripts/key_sweep.py --keys rms_norm_eps,layer_norm_epsilon,layer_norm_eps,norm_eps,norm_epsilon --value 0.01

Measured 2026-12-07 with the norm epsilons at 0.01: docs/measurements/2026-12-07-norm-eps.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import budget, families  # noqa: E402
from harness.case import Case, CaseRun  # noqa: E402
from harness.errors import UsageError  # noqa: E402
from harness.fuzz import layer_count_key, layer_count_overrides  # noqa: E402
from harness.policy import load_policy  # noqa: E402

BAD = ("fail", "error", "unguarded", "missing")


def _declares(fam, key: str) -> bool:
    """Whether ``fam``'s config has ``key``: a field, or ``table.sub`` -- one key of a table
    field its tiny config holds (``rope_parameters.rope_theta``; not where the table is one
    per layer type, as gemma3's)."""
    if "." not in key:
        return key in set(fam.settable_keys())
    top, sub = key.split(".", 1)
    table = getattr(fam.make_config({}), top, None) if top in set(fam.settable_keys()) else None
    return isinstance(table, dict) and sub in table


def sweep(keys: list[str], value, names: list[str], tokens: int, layers: str | None = None) -> list[dict]:
    """``layers``: instead of ``keys`` = ``value``, the layer count -- ``"1"``, or ``"+1"``
    for one more than the tiny config's -- with its per-layer lists (fuzz.layer_count_overrides)."""
    pol = load_policy()
    out = []
    for name in names:
        fam = families.get(name)
        if layers is not None:
            lk = layer_count_key(fam)
            ov = layer_count_overrides(fam, fam.tiny[lk] + int(layers) if layers.startswith("+") else int(layers)) \
                if lk else {}
            ks, value = list(ov), None
        else:
            ks = [k for k in keys if _declares(fam, k)]
            ov = {k: value for k in ks}
        if not ks:
            out.append({"family": name, "keys": [], "status": "no such key"})
            continue
        try:
            case = Case(family=name, ref="all", backend="numpy", dtype="float32", kv="decode", schedule="prefill",
                        tokens=tokens, overrides=tuple(ov.items()))
            case.validate()
            cr = CaseRun(case, pol)
            _ = cr.layer_cfgs
            budget.check(cr)  # what the CLI refuses before any work: a reference's config_refusal
            rows = cr.rows()
        except UsageError as e:  # the family's config validation, or a reference's refusal (its line)
            out.append({"family": name, "keys": ks, "status": "refused", "reason": str(e)})
            continue
        except Exception as e:  # noqa: BLE001 -- a crash is a row of the survey, and it goes on
            out.append({"family": name, "keys": ks, "status": "diverges", "bad_rows": 1,
                        "first": {"the case": f"crashed: {type(e).__name__}: {str(e)[:160]}"}})
            print(f"{name}: crashed ({type(e).__name__})", file=sys.stderr, flush=True)
            continue
        bad = [r for r in rows if r["status"] in BAD]
        first = {}
        for r in bad:  # the first failing probe per (candidate, reference)
            first.setdefault((r["candidate"], r["reference"]), f"L{r['layer']} {r['probe']}: {r['reason'][:120]}")
        out.append({"family": name, "keys": ks, "status": "diverges" if bad else "pass", "bad_rows": len(bad),
                    "first": {f"{c} vs {ref}": v for (c, ref), v in first.items()}})
        print(f"{name}: {out[-1]['status']} ({len(bad)} bad rows)", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", help="comma-separated config keys (every one a family declares is set)")
    ap.add_argument("--value", help="the value, as JSON (0.01, true, \"yarn\")")
    ap.add_argument("--layers", help="instead of --keys/--value: the layer count, N or +N (more than the tiny "
                                     "config's), with the per-layer lists the tiny config spells out cycled to it")
    ap.add_argument("--family", action="append", help="only this family (repeatable; default: every family)")
    ap.add_argument("--tokens", type=int, default=6)
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    a = ap.parse_args(argv)
    if a.layers is not None:
        if not (a.layers.lstrip("+").isdigit() and int(a.layers.lstrip("+")) > 0):
            print(f"key_sweep: --layers {a.layers!r} is not a layer count; valid: N or +N, N a positive integer",
                  file=sys.stderr)
            return 2
    elif not (a.keys and a.value):
        print("key_sweep: name --keys and --value, or --layers", file=sys.stderr)
        return 2
    try:
        value = json.loads(a.value) if a.layers is None else None
    except json.JSONDecodeError:
        print(f"key_sweep: --value {a.value!r} is not JSON; valid: a number, true/false, null or a quoted string",
              file=sys.stderr)
        return 2
    known = sorted(families.registry())
    for f in a.family or ():
        if f not in known:
            print(f"key_sweep: unknown family {f!r}; valid: {', '.join(known)}", file=sys.stderr)
            return 2
    res = sweep([k.strip() for k in (a.keys or "").split(",") if k.strip()], value, a.family or known, a.tokens,
                a.layers)
    for r in res:
        if r["status"] == "diverges":
            print(f"- {r['family']} ({', '.join(r['keys'])}): {r['bad_rows']} bad rows; "
                  + "; ".join(f"{k}: {v}" for k, v in r["first"].items()))
        elif r["status"] == "refused":
            print(f"- {r['family']} ({', '.join(r['keys'])}): refused: {r['reason'][:200]}")
    n = sum(r["status"] == "diverges" for r in res)
    print(f"{n} of {sum(r['status'] != 'no such key' for r in res)} families with the key diverge at {a.value if a.layers is None else 'layers ' + a.layers}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
