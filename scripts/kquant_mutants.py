"""The mutants a matrix spec's cases can judge, comma-separated, for
``conformance mutate SPEC --mutants``:

    python scripts/kquant_mutants.py [SPEC]   (default fixtures/matrix/kquant.toml)

Candidates: every mutant whose decoration (a feature tag) some case of the spec
exercises, and the core ones (mask, positions, default scale, residual: every
case exercises them). Of those, a mutant that changes NO output of impl on any
case of the spec -- impl's every probe, every layer, the same bits with and
without it, its layer configs and weights derived anew under it from the
case's model, fed the same seeded inputs -- is EQUIVALENT there
(the standard exclusion of mutation testing: no comparison, however tight, can
see it) and is left out, named on stderr with the reason. E.g. on the Q4_K_M
files of llama, qwen3, gemma3, gpt_oss and deepseek_v2: the o_proj bias moved
past a post-norm (no family of the five has both), past granite's residual
multiplier (none has one), YaRN's truncate flag (true in all: llama.cpp can
express no other), deepseek2's MLA YaRN magnitude (1 whenever mscale ==
mscale_all_dim: llama.cpp's deepseek2 has no other), the output gate's own
bias dropped or swapped for the Q bias (no family of the five has an output
gate; their qkv_bias tag is the plain Q/K/V bias), the recurrent state kept on
the paged KV pool (tag kv_paged, but none of the five has a recurrent layer
whose state could go there), MiniCPM3's rotate-half MLA slice rotated in pairs
(tag mla_rope, but deepseek_v2 rotates pairs already). A subtle mutant (a parameter
off by a percent, harness/kinds/attention/mutants/subtle.py) sized for float precisions only
(``Mutant.dtypes``) is left out too, named as not visible at the cases'
quantized weight type -- as ``conformance mutate`` counts it per precision.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.case import CaseRun  # noqa: E402
from harness.families.base import NotInImpl  # noqa: E402
from harness.matrix import load_spec  # noqa: E402
from harness.mutants import applied, registry  # noqa: E402
from harness.policy import load_policy  # noqa: E402
from harness.ggml_types import is_quantized  # noqa: E402
from harness.schedule import chunk_sizes  # noqa: E402
from impl import Backend  # noqa: E402
from impl.runner import load_layer, run_layer  # noqa: E402


def impl_outputs(run: CaseRun) -> dict[str, np.ndarray]:
    """impl's every probe on the case's layers, fed seeded inputs (no reference
    needed: only whether the mutant changes anything is asked)."""
    rng = np.random.default_rng(run.case.seed)
    weights = run.weights_for("float32")
    out = {}
    for i, lc in enumerate(run.layer_cfgs):
        if isinstance(lc, NotInImpl):
            continue
        seqs, tokens = run.tokens.shape
        x = [rng.standard_normal((tokens, lc.hidden_size)) for _ in range(seqs)]
        layer = load_layer(lc, weights[i], Backend("numpy", "cpu", "float32"))
        with np.errstate(all="ignore"):
            # the case's schedule, the same chunks for every sequence (harness/schedule.py)
            chunks = [chunk_sizes(run.case.schedule, tokens)] * seqs
            _, traces, _ = run_layer(layer, x, run.case.kv, chunks, page_size=run.case.page_size,
                                     seed=run.case.seed, evict=run.case.evict)
        for s, t in enumerate(traces):
            out.update({f"{s}.L{i}.{p}": np.asarray(v) for p, v in t.assemble().items()})
    return out


def rebuilt(run: CaseRun) -> CaseRun:
    """The case again -- its layer configs and impl weights derived anew (impl's
    own code, e.g. the RoPE tables, runs there) -- on the same HF model."""
    again = CaseRun(run.case, run.policy)
    again.__dict__.update(float_model=run.float_model, base_model=run.base_model)
    again.hf_types = run.hf_types
    return again


def changes_something(m, runs: list[CaseRun], clean: list[dict]) -> bool:
    with applied(m):
        for run, want in zip(runs, clean):
            try:
                got = impl_outputs(rebuilt(run))
            except Exception:  # the mutant crashes impl: a comparison sees that
                return True
            if got.keys() != want.keys() or any(not np.array_equal(got[k], want[k], equal_nan=True) for k in want):
                return True
    return False


def main(spec: str) -> int:
    policy = load_policy()
    runs = [CaseRun(case, policy) for case in load_spec(spec).cases]
    features = set().union(*(set(r.features) for r in runs))
    clean = [impl_outputs(rebuilt(r)) for r in runs]
    # a quantized case's precision is its weight type's: a subtle mutant (harness/kinds/attention/mutants/subtle.py)
    # whose `dtypes` do not name it is sized below that rounding -- main's mutate counts it only
    # where visible (Mutant.visible_at); `mutate --sensitivity` measures what is seen there
    precisions = {r.case.gguf_type if is_quantized(r.case.gguf_type) else r.case.dtype for r in runs}
    chosen = []
    for m in registry().values():
        if not (m.core or m.decoration in features):
            continue
        # a subtle mutant sized for float precisions is left out by that declaration alone; any
        # other is asked first whether it changes anything at all (main's yarn-truncate-ignored
        # declares float32 / float64, but no case here can express truncate=false: equivalent)
        visible = any(m.visible_at(p) for p in precisions)
        mine = [(r, c) for r, c in zip(runs, clean) if m.core or m.decoration in r.features]
        if not m.subtle or visible:
            if not changes_something(m, [r for r, _ in mine], [c for _, c in mine]):
                print(f"equivalent on {spec}: {m.name} ({m.decoration}) changes no output of impl on the "
                      f"{len(mine)} case(s) that exercise {m.decoration}", file=sys.stderr)
                continue
        if not visible:
            print(f"not visible on {spec}: {m.name} (sized for {', '.join(m.dtypes)}; the cases compare at "
                  f"{', '.join(sorted(precisions))})", file=sys.stderr)
            continue
        chosen.append(m.name)
    print(",".join(sorted(chosen)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "fixtures" / "matrix" / "kquant.toml")))
