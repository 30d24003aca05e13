"""An example dump writer: run an engine on a case `conformance export-case`
wrote, and write the dump `conformance judge` reads.

    conformance export-case --family llama --ref all --out /tmp/case
    python examples/dump_writer.py /tmp/case /tmp/dump
    conformance judge /tmp/dump

The engine here is examples/tiny_engine (NumPy); an engine in Rust or C++ does
the same with its own safetensors and JSON libraries -- the format is the one
harness/candidates/dump.py describes: manifest.json, and per run (one per
reference whose layer inputs it was fed) one safetensors file per layer with
tensors named "L{layer}.{probe}" in the canonical layout (case.json's
"probe_shapes"). `--plant-error L1.q_rope` scales one tensor by (1 + 1e-3),
to see a dump that is wrong fail.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "tiny_engine"))
import tiny_engine  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", type=Path, help="a directory conformance export-case wrote")
    p.add_argument("dump", type=Path, help="the dump directory to write")
    p.add_argument("--dtype", default="float32", choices=sorted(tiny_engine.DTYPES))
    p.add_argument("--plant-error", metavar="L{i}.{probe}", help="scale this tensor by 1 + 1e-3 (a wrong dump)")
    a = p.parse_args(argv)
    case = json.loads((a.case / "case.json").read_text())
    if a.plant_error is not None:
        # a typo (L1.qrope) must not write a clean dump and exit 0: the name must be a tensor this writer writes
        layers = [lay["index"] for lay in case["layers"] if lay["implemented"]]
        m = re.fullmatch(r"L(\d+)\.(\w+)", a.plant_error)
        if not m or int(m.group(1)) not in layers or m.group(2) not in case["probe_shapes"]:
            print(f"dump_writer: --plant-error {a.plant_error!r} names no tensor of this dump; valid: L{{i}}.{{probe}} "
                  f"with i in {layers} and probe one of {', '.join(case['probe_shapes'])}", file=sys.stderr)
            return 2
    made = not a.dump.exists()
    rc = 1
    try:
        rc = write(a, case)
        return rc
    finally:
        if rc != 0 and made:
            shutil.rmtree(a.dump, ignore_errors=True)  # nothing half-written left behind


def write(a, case) -> int:
    weights = load_file(str(a.case / case["weights"]["layers"]))
    not_exposed = {}
    runs = {}
    planted = False
    for ref, info in case["references"].items():
        inputs = load_file(str(a.case / info["inputs"]))
        out = a.dump / ref
        out.mkdir(parents=True, exist_ok=True)
        for lay in case["layers"]:
            i = lay["index"]
            if not lay["implemented"]:
                continue  # a layer the harness has no description of: nothing to feed
            w = {k.split(".", 1)[1]: v for k, v in weights.items() if k.startswith(f"L{i}.")}
            why = tiny_engine.unsupported(lay["config"], w)
            if why:
                print(f"dump_writer: tiny_engine does not compute layer {i}'s {why}", file=sys.stderr)
                return 2
            x = inputs[f"L{i}.layer_in"]  # [S, T, hidden]: this reference's input to the layer
            per_seq = [tiny_engine.layer(lay["config"], w, x[s], a.dtype) for s in range(x.shape[0])]
            tensors = {f"L{i}.{probe}": np.stack([r[probe] for r in per_seq]) for probe in per_seq[0]}
            if a.plant_error in tensors:
                tensors[a.plant_error] = tensors[a.plant_error] * (1 + 1e-3)
                planted = True
            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out / f"L{i}.safetensors"))
        runs[ref] = ref
    manifest = {
        "format": case["dump"]["format"],
        "engine": {"name": "tiny-engine-dump", "version": tiny_engine.__version__},
        "case": case["case"], "family": case["family"], "config": case["hf_config"],
        "weights": str(a.case / case["weights"]["layers"]), "tokens": case["tokens"], "dtype": a.dtype,
        "runs": runs, "not_exposed": not_exposed,
    }
    if a.plant_error is not None and not planted:
        print(f"dump_writer: tiny_engine does not emit {a.plant_error}; nothing planted, no dump written", file=sys.stderr)
        return 2
    (a.dump / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"dump: {a.dump} ({', '.join(runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
