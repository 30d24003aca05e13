"""Print the README's table of families and features from a matrix run.

    .venv/bin/python scripts/family_table.py [RUN_DIR]   (default: fixtures/baselines/default)
    .venv/bin/python scripts/family_table.py --gguf      (what --gguf reads, per family)

One row per family: its HF model type and llama.cpp arch, the decorations its
cases exercise (feature tags derived from impl's configs), and per comparison
pair the status over all its cases: pass, "finding" (a known, written-down
disagreement of the references; see fixtures/tolerance.toml) or FAIL."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import families  # noqa: E402
from harness.report import read_rows  # noqa: E402

PAIRS = (("impl", "hf"), ("impl", "llamacpp"), ("llamacpp", "hf"))


def gguf_table() -> int:
    """Per family: the metadata ``--gguf`` reads -- llama.cpp's own reading of the
    arch (harness/gguf/llamacpp_keys.py: ``load_hparams``' keys for every
    arch, plus the arch's ``load_arch_hparams``), the ``.scale`` tensors its graph
    applies, and where the HF reference's weights come from."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    from harness.gguf.llamacpp_keys import BY_ARCH, SCALES

    print("| family | llama.cpp arch | keys `load_arch_hparams` reads (beyond `load_hparams`') "
          "| `.scale` tensors its graph applies | HF reference for `--gguf` |")
    print("|---|---|---|---|---|")
    for name, fam in families.registry().items():
        arch = fam.gguf_arch
        keys = sorted(BY_ARCH.get(arch, ())) if arch else []
        scales = sorted(SCALES.get(arch, ())) if arch else []
        hf = ("transformers' GGUF loader (where it agrees with llama.cpp's reading)"
              if arch in GGUF_SUPPORTED_ARCHITECTURES or (arch or "").replace("-", "_") in GGUF_SUPPORTED_ARCHITECTURES
              else "the harness's reverse map")
        print(f"| {name} | {arch or '-'} | {', '.join(f'`{k}`' for k in keys) or '-'} | "
              f"{', '.join(scales) or '-'} | {hf} |")
    return 0


def main(run_dir: str) -> int:
    df = read_rows(Path(run_dir))
    print("| family | HF model type | llama.cpp arch | decorations exercised | impl vs HF | impl vs llama.cpp "
          "| HF vs llama.cpp |")
    print("|---|---|---|---|---|---|---|")
    for name, fam in families.registry().items():
        rows = df[df["family"] == name]
        feats = sorted({t for fs in rows["features"] for t in str(fs).split(";") if t and not t.startswith("kv_")})
        cells = []
        for cand, ref in PAIRS:
            r = rows[(rows["candidate"] == cand) & (rows["reference"] == ref)]
            if r.empty:
                cells.append("-")
                continue
            st = set(r["status"])
            if st & {"fail", "error"}:
                cells.append("**FAIL**")
            elif "finding" in st:
                n = r[r["status"] == "finding"]["case_id"].nunique()
                cells.append(f"pass; finding in {n} case{'s' * (n != 1)}")
            else:
                cells.append("pass")
        print(f"| {name} | `{fam.hf_model_type}` | {fam.gguf_arch or '-'} | {', '.join(feats)} | " + " | ".join(cells)
              + " |")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--gguf"]:
        sys.exit(gguf_table())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "fixtures" / "baselines" / "default")))
