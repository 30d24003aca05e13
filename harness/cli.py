"""The ``conformance`` command.

Exit status: 0 everything compared passed, 1 something failed (or nothing was
compared), 2 bad input -- one line on stderr naming what was wrong and what is
valid, no traceback, no report directory left behind.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the whole usage)
        raise UsageError(f"{self.prog}: {message}")


def parse_set(items: list[str] | None) -> tuple:
    out = []
    for item in items or []:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"malformed --set {item!r}: expected KEY=VALUE, e.g. --set num_key_value_heads=1")
        out.append((key.strip(), parse_value(raw)))
    return tuple(out)


def parse_value(raw: str):
    lit = {"true": True, "false": False, "null": None, "none": None}
    if raw.strip().lower() in lit:
        return lit[raw.strip().lower()]
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _add_case_args(p: argparse.ArgumentParser) -> None:
    from impl.backend import BACKENDS, DEVICES, DTYPES

    p.add_argument("--family", help="model family (see `conformance list`)")
    p.add_argument("--ref", default=None, help="hf, llamacpp or all (default hf; llamacpp with --gguf)")
    p.add_argument("--backend", default="numpy", help=f"{', '.join(BACKENDS)} (default numpy)")
    p.add_argument("--device", default="cpu", help=f"{', '.join(DEVICES)} (default cpu)")
    p.add_argument("--dtype", default="float32", help=f"{', '.join(DTYPES)} (default float32)")
    p.add_argument("--kv", default="decode", help="decode, batched or paged (default decode)")
    p.add_argument("--schedule", default="mixed",
                   help="prefill, decode, mixed (half in one call, then one row per call) or chunk sizes 5,1,1")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override an HF config field (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--seqs", type=int, default=None, help="sequences (default 1 for decode, 2 otherwise)")
    p.add_argument("--page-size", type=int, default=4, help="rows per page for --kv paged (default 4)")
    p.add_argument("--gguf-type", default="f32",
                   help="weight type of the GGUF the family's export is written as: f32, f16, bf16, or any "
                        "llama_model_quantize type (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m, "
                        "q6_k, iq4_xs, iq4_nl ...; see harness/refs/ggml_types.py); HF and impl then run on "
                        "the file's dequantized weights")
    p.add_argument("--hf-model", metavar="PATH", help="a local HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--gguf", metavar="PATH", help="a GGUF file: compare impl against llama.cpp on it")
    p.add_argument("--variant", help="a family's named variant (MLA families: absorbed, naive)")
    p.add_argument("--prompt", metavar="TEXT", help="token ids from this text, tokenized by llama.cpp with the "
                                                    "GGUF's own vocabulary (default: seeded random ids)")
    p.add_argument("--policy", metavar="TOML", help="tolerance policy (default fixtures/tolerance.toml)")


def case_from_args(a):
    from .case import Case

    if not a.family and not a.gguf and not a.hf_model:
        raise UsageError("--family is required (or --hf-model PATH / --gguf PATH); see `conformance list`")
    family = a.family
    if a.hf_model and not family:
        from .refs.checkpoint import family_of

        family = family_of(a.hf_model)
    ref = a.ref if a.ref is not None else ("llamacpp" if a.gguf else "hf")
    return Case(family=family or "", ref=ref, backend=a.backend, device=a.device, dtype=a.dtype, kv=a.kv,
                schedule=a.schedule, seed=a.seed, tokens=a.tokens, seqs=a.seqs, overrides=parse_set(a.set),
                gguf_type=a.gguf_type, hf_model=a.hf_model, gguf=a.gguf, page_size=a.page_size,
                variant=a.variant, prompt=a.prompt)


def _require_device(case) -> None:
    """One case asked for by hand on a device this machine lacks is bad input (a
    matrix that lists such cases records them as skipped instead)."""
    from impl import Backend
    from impl.config import ConfigError

    try:
        Backend(case.backend, case.device, case.dtype).check_available()
    except ConfigError as e:
        raise UsageError(str(e)) from None


def cmd_run(a) -> int:
    from . import report
    from .case import CaseRun
    from .policy import load_policy

    policy = load_policy(a.policy)
    case = case_from_args(a)
    case.validate()
    _require_device(case)
    run = CaseRun(case, policy, progress=lambda m: print(m, file=sys.stderr))
    _ = run.layer_cfgs  # bad shapes are refused here, before anything is written
    t0 = time.time()
    rows = run.rows()
    run_id = report.new_run_id()
    d = report.run_dir(a.out, run_id)
    df = report.write_rows(d, rows)
    report.write_meta(d, {"run_id": run_id, "command": "run", "argv": sys.argv[1:], "case": case.to_dict(),
                          "features": run.features, "timings": run.timings, "wall_s": time.time() - t0,
                          **run.meta_extra()})
    print(report.case_table(df))
    print(f"report: {d}")
    return report.exit_status(df)


def cmd_list(a) -> int:
    from impl.backend import BACKENDS, DEVICES, DTYPES
    from impl.kv import KV_MODES
    from impl.runner import SCHEDULES
    from impl.trace import LAYER_PROBES, MODEL_PROBES

    from . import families
    from .case import REF_CHOICES
    from .features import model_features

    print("families:")
    for name, fam in families.registry().items():
        cfg = fam.make_config({})
        lcs = fam.layer_configs(cfg)
        model = fam.build_model(cfg, 0) if a.features else None
        feats = sorted(model_features(lcs, [fam.layer_weights(model, cfg, i) if model is not None else {}
                                            for i in range(len(lcs))])) if model is not None else []
        line = f"  {name:<16} hf={fam.hf_model_type:<16} gguf={fam.gguf_arch or '-':<12} {fam.description}"
        print(line)
        if feats:
            print(f"  {'':<16} features: {', '.join(feats)}")
    print(f"references: {', '.join(REF_CHOICES)}")
    print(f"backends: {', '.join(BACKENDS)}; devices: {', '.join(DEVICES)}; dtypes: {', '.join(DTYPES)}")
    print(f"kv modes: {', '.join(KV_MODES)}; schedules: {', '.join(SCHEDULES)}")
    print(f"layer probes: {', '.join(LAYER_PROBES)}")
    print(f"model probes: {', '.join(MODEL_PROBES)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="conformance", description="Differential conformance harness for attention implementations")
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    r = sub.add_parser("run", help="run one case and write reports/<run-id>/")
    _add_case_args(r)
    r.add_argument("--out", metavar="DIR", help="run directory (default reports/<run-id>)")
    r.set_defaults(fn=cmd_run)
    ls = sub.add_parser("list", help="families, features, probes, backends")
    ls.add_argument("--features", action="store_true", help="build each family to list its derived features")
    ls.set_defaults(fn=cmd_list)
    for mod in _extra_commands():
        mod.register(sub)
    return p


def _extra_commands():
    """Subcommands that live in their own modules (matrix, features, diff, ...)."""
    import importlib

    mods = []
    for name in ("matrix", "merge", "featmap", "diff", "bisect", "mutate", "mla_cache"):
        try:
            mods.append(importlib.import_module(f"harness.commands.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"harness.commands.{name}" and e.name != "harness.commands":
                raise
    return mods


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        a = parser.parse_args(argv)
        if not getattr(a, "fn", None):
            parser.print_help()
            return 2
        return int(a.fn(a) or 0)
    except UsageError as e:
        print(f"conformance: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("conformance: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
