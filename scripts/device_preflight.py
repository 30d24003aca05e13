"""The device check's first step: what is here, which device, which matrix.

    python scripts/device_preflight.py --device auto|cuda|mps|cpu --spec PATH --env PATH [--families LIST]

Prints ONE line naming the interpreter, torch and the device, and every
missing package with what it costs (``missing: llama_cpp, gguf (the llama.cpp
reference is skipped)``). Writes the matrix spec the check runs -- the smoke
matrix's torch cases (fixtures/matrix/smoke.toml, group ``torch-decode``: every
family and variant, decode KV) on the chosen device in float32, float16 and
bfloat16, against each reference present -- and ``env.json`` (versions, the
device, the cuda numerics pinned, every skip with its reason).

Exit status 2, with one line on stderr, when the check cannot run at all: a
package impl or the HF reference needs is missing, the device asked for is
absent, or no GPU is visible and none was named (``DEVICE=cpu`` runs the
CPU-sized check).

What is skipped is never silent: the llama.cpp reference when
llama-cpp-python / gguf are missing, and any family whose HF model type the
installed transformers does not know -- each with its reason in env.json and
in the check's summary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# module -> what cannot run without it
REQUIRED = {
    "numpy": "impl",
    "torch": "impl",
    "array_api_compat": "impl (its array namespace)",
    "transformers": "the HF reference",
    "safetensors": "the HF reference",
    "pandas": "the matrix report",
    "pyarrow": "the matrix report (rows.parquet)",
    "pytest": "the gpu tests",
}
OPTIONAL = {
    "llama_cpp": "the llama.cpp reference is skipped",
    "gguf": "the llama.cpp reference is skipped",
    "xdist": "tests run in one process",
    "rich": "no progress bar",
}
DTYPES = ["float32", "float16", "bfloat16"]
SMOKE = ROOT / "fixtures" / "matrix" / "smoke.toml"
SMOKE_GROUP = "torch-decode"
# DEVICE=cpu: the CPU-sized matrix, one family per path of the body -- plain GQA
# and the wo-scale variant, softcap + sliding window + rms1p + post-norm, sinks +
# YaRN, ALiBi + LayerNorm, MLA in both forms: 42 cases, about a minute on 2 cores
# with the captures cached.
CPU_FAMILIES = ["llama", "gemma2", "gpt_oss", "bloom", "deepseek_v2"]


def fail(msg: str) -> None:
    print(f"device_check: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _version(mod) -> str:
    return str(getattr(mod, "__version__", "?"))


def probe_modules() -> tuple[dict, dict]:
    found, missing = {}, {}
    for name, why in {**REQUIRED, **OPTIONAL}.items():
        try:
            found[name] = _version(importlib.import_module(name))
        except Exception as e:  # ImportError, or a broken install that raises on import
            missing[name] = f"{why} ({type(e).__name__})" if name in REQUIRED else why
    return found, missing


def resolve_device(torch, asked: str) -> str:
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if asked == "auto":
        if cuda:
            return "cuda"
        if mps:
            return "mps"
        fail(f"no cuda or mps device is visible to torch {torch.__version__} "
             f"(cuda build: {torch.version.cuda or 'no'}); DEVICE=cpu runs the CPU-sized check")
    if asked not in ("cuda", "mps", "cpu"):
        fail(f"unknown DEVICE {asked!r}; valid: cuda, mps, cpu (unset: cuda or mps, whichever is present)")
    if asked == "cuda" and not cuda:
        fail(f"DEVICE=cuda but torch {torch.__version__} sees no cuda device; valid here: "
             f"{'mps, ' if mps else ''}cpu")
    if asked == "mps" and not mps:
        fail(f"DEVICE=mps but torch {torch.__version__} sees no mps device; valid here: {'cuda, ' if cuda else ''}cpu")
    return asked


def smoke_torch_group() -> dict:
    """The smoke matrix's torch cases, as its spec writes them (one place to change them)."""
    spec = tomllib.loads(SMOKE.read_text())
    for g in spec.get("group", []):
        if g.get("name") == SMOKE_GROUP:
            return g
    fail(f"{SMOKE} has no [[group]] named {SMOKE_GROUP!r}; the device check runs that group's cases")


def families_for(asked: str | None, device: str, transformers) -> tuple[list[str], dict]:
    from harness import families

    reg = families.registry()
    if asked:
        names = list(reg) if asked == "*" else [f.strip() for f in asked.split(",") if f.strip()]
        unknown = [f for f in names if f not in reg]
        if unknown:
            fail(f"unknown famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)} in FAMILIES; "
                 f"valid: * or any of {', '.join(reg)}")
    else:
        names = CPU_FAMILIES if device == "cpu" else list(reg)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    skipped = {}
    for f in names:
        t = reg[f].hf_model_type
        if t not in CONFIG_MAPPING_NAMES:
            skipped[f] = f"transformers {transformers.__version__} has no model type {t!r}"
    return [f for f in names if f not in skipped], skipped


def write_spec(path: Path, device: str, fams: list[str], refs: list[str]) -> str:
    g = smoke_torch_group()
    variants = g.get("variants", "*")
    lines = [
        "# Written by scripts/device_preflight.py: the smoke matrix's torch cases",
        f"# (fixtures/matrix/smoke.toml, group {SMOKE_GROUP!r}) on {device}, in each dtype, against each",
        "# reference present (each its own case: HF computes in the case's dtype, llama.cpp in float32).",
        'name = "device-check"',
        f'description = "smoke {SMOKE_GROUP} on {device}: float32, float16, bfloat16 against {", ".join(refs)}"',
        f"families = {json.dumps(fams)}",
        f"variants = {json.dumps(variants)}",
        f"backends = {json.dumps(g.get('backends', ['torch']))}",
        f'devices = ["{device}"]',
        f"kv_modes = {json.dumps(g.get('kv_modes', ['decode']))}",
        f"dtypes = {json.dumps(DTYPES)}",
        f"references = {json.dumps(refs)}",
    ]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="device check preflight")
    p.add_argument("--device", default="auto")
    p.add_argument("--spec", required=True, help="where to write the matrix spec")
    p.add_argument("--env", required=True, help="where to write env.json")
    p.add_argument("--families", default=None, help="comma list or * (default: all on a GPU, a CPU-sized set on cpu)")
    a = p.parse_args(argv)

    found, missing = probe_modules()
    head = f"python {platform.python_version()} ({sys.executable})"
    fatal = {m: why for m, why in missing.items() if m in REQUIRED}
    miss = "; missing: " + ", ".join(f"{m} ({why})" for m, why in missing.items()) if missing else "; nothing missing"
    if "torch" in fatal:
        print(f"preflight: {head}{miss}")
        fail("torch is not importable here; the device check needs it (README: GPU)")
    import torch

    device = resolve_device(torch, a.device)
    dev_name = torch.cuda.get_device_name() if device == "cuda" else device
    print(f"preflight: {head}, torch {torch.__version__} on {device} ({dev_name}){miss}")
    if fatal:
        fail(f"cannot run without {', '.join(fatal)}; carry the wheels in .whl/ (README: GPU, scripts/device_wheels.sh)")
    import transformers

    skips = []
    refs = ["hf"]
    if "llama_cpp" in missing or "gguf" in missing:
        skips.append({"what": "reference llamacpp", "reason": "llama-cpp-python / gguf not importable here: "
                      + ", ".join(f"{m}" for m in ("llama_cpp", "gguf") if m in missing)})
    else:
        refs.append("llamacpp")
    fams, fam_skips = families_for(a.families, device, transformers)
    skips += [{"what": f"family {f}", "reason": r} for f, r in fam_skips.items()]
    if not fams:
        fail("no family left to run (every one skipped: " + "; ".join(fam_skips.values()) + ")")
    spec = write_spec(Path(a.spec), device, fams, refs)

    from impl.backend import pin_cuda_numerics

    env = {
        "device": device, "device_name": dev_name, "python": platform.python_version(), "executable": sys.executable,
        "packages": found, "missing": missing, "skipped": skips, "references": refs, "families": fams,
        "dtypes": DTYPES, "matrix_spec": spec,
        "cuda": {"torch_cuda": torch.version.cuda, "numerics_pinned": pin_cuda_numerics()} if device == "cuda" else None,
        "xdist": "xdist" not in missing,
    }
    Path(a.env).write_text(json.dumps(env, indent=1))
    for s in skips:
        print(f"preflight: skipped {s['what']}: {s['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
