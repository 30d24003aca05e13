"""``conformance mla-cache``: what multi-head latent attention saves, measured.

For every registered family with MLA layers: build its tiny model, load each
MLA layer into impl in both forms (``naive``: per-head K ``[H, nope + rope]``
and V ``[H, v]`` per position; ``absorbed``: one latent row ``[kv_lora_rank +
rope]``, no V), run ``--tokens`` rows through it in every KV backing, and read
back the bytes the caches impl holds: ``ContiguousKv.nbytes()`` per sequence
(decode, batched) and ``PagePool.nbytes_per_row()`` (paged), per MLA layer,
summed over the layers, per token. Nothing is computed from the formula; the
formula is written beside the measurement (``formula_bytes_per_token``) so a
cache that holds more than it should shows.

Writes ``mla_cache.csv`` and one ``<family>.png`` per family (bars: naive vs
absorbed per KV mode) under ``--out``, and prints a table.
"""

from __future__ import annotations

import sys
from pathlib import Path
import numpy as np

from ..errors import UsageError
from harness.lazy import lazy
from impl.mla import MlaConfig
from .. import families
from impl import Backend
from impl.runner import load_layer, run_layer
from ..schedule import chunk_sizes
from impl.config import ConfigError
from .. import report

backend_agg = lazy("matplotlib.backends.backend_agg")
matplotlib_figure = lazy("matplotlib.figure")
pd = lazy("pandas")

KV_MODES = ("decode", "batched", "paged")
FORMS = ("naive", "absorbed")


def register(sub) -> None:
    p = sub.add_parser("mla-cache", help="MLA families: KV-cache bytes per token impl holds, naive vs absorbed, per KV mode")
    p.add_argument("--out", metavar="DIR", help="where to write mla_cache.csv and the PNGs (default reports/mla-cache-<run id>)")
    p.add_argument("--tokens", type=int, default=16, help="rows per sequence (default 16)")
    p.add_argument("--family", action="append", help="only this MLA family (repeatable; default: every MLA family)")
    p.add_argument("--backend", default="numpy", help="numpy or torch (default numpy)")
    p.add_argument("--dtype", default="float32", help="the cache's dtype (default float32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the rows (default 0)")
    p.set_defaults(fn=cmd_mla_cache)


def mla_families(names: list[str] | None = None) -> dict:
    """The registered families whose default config has MLA layers (discovered
    from their impl layer configs, not listed)."""

    reg = families.registry()
    if names:
        for n in names:
            families.get(n)  # unknown name: a UsageError naming the valid ones
    out = {}
    for name, fam in reg.items():
        if names and name not in names:
            continue
        if "absorbed" not in fam.variants or "naive" not in fam.variants:
            continue
        cfg = fam.make_config({})
        if any(isinstance(lc, MlaConfig) for lc in fam.layer_configs(cfg, "absorbed")):
            out[name] = fam
    if names and set(names) - set(out):
        raise UsageError(f"not an MLA family: {', '.join(sorted(set(names) - set(out)))}; MLA families: "
                         f"{', '.join(n for n, f in reg.items() if 'absorbed' in f.variants) or '(none)'}")
    return out


def measure(family, tokens: int = 16, backend: str = "numpy", dtype: str = "float32", seed: int = 0) -> list[dict]:
    """One row per (form, KV mode): the cache bytes per token impl holds for
    ``family``'s tiny model, all MLA layers together."""

    _check_tokens(tokens)
    be = Backend(backend, "cpu", dtype)
    config = family.make_config({})
    model = family.build_model(config, seed)
    rng = np.random.default_rng(seed)
    rows = []
    for form in FORMS:
        lcs = family.layer_configs(config, form)
        mla = [(i, lc) for i, lc in enumerate(lcs) if isinstance(lc, MlaConfig)]
        weights = {i: family.layer_weights(model, config, i) for i, _ in mla}
        for kv in KV_MODES:
            n_seq = 1 if kv == "decode" else 2
            inputs = [rng.standard_normal((tokens, config.hidden_size)) for _ in range(n_seq)]
            held, formula = 0.0, 0
            for i, lc in mla:
                layer = load_layer(lc, weights[i], be)

                plan = [chunk_sizes("mixed", len(x)) for x in inputs]
                _, _, steps = run_layer(layer, inputs, kv, plan, trace=False, seed=seed)
                if kv == "paged":
                    # one pool per layer, shared by the sequences: the bytes of one row
                    held += steps[0].pool.nbytes_per_row()
                else:
                    held += sum(s.cache.nbytes() for s in steps) / (tokens * n_seq)
                k_shape, v_shape = layer.kv_row_shapes()
                formula += (int(np.prod(k_shape)) + (int(np.prod(v_shape)) if v_shape else 0)) * _itemsize(dtype)
            rows.append(dict(family=family.name, form=form, kv=kv, mla_layers=len(mla), tokens=tokens, seqs=n_seq,
                             dtype=dtype, backend=backend, bytes_per_token=held,
                             bytes_per_token_per_layer=held / max(len(mla), 1),
                             formula_bytes_per_token=formula))
    return rows


def _check_tokens(tokens: int) -> None:
    if tokens < 1:
        raise UsageError(f"--tokens must be a positive integer, got {tokens}")


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def plot(rows: list[dict], path: Path) -> Path:
    """Bars: naive vs absorbed bytes per token, grouped by KV mode (Agg backend)."""
    fam = rows[0]["family"]
    fig = matplotlib_figure.Figure(figsize=(6.0, 3.6))
    backend_agg.FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(KV_MODES))
    width = 0.38
    for j, form in enumerate(FORMS):
        vals = [next(r["bytes_per_token"] for r in rows if r["form"] == form and r["kv"] == kv) for kv in KV_MODES]
        bars = ax.bar(x + (j - 0.5) * width, vals, width, label=form, color=("#c0504d", "#4f81bd")[j])
        for b, v in zip(bars, vals):
            ax.annotate(f"{v:g}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=8)
    ax.set_xticks(x, KV_MODES)
    ax.set_ylabel("cache bytes per token")
    r0 = rows[0]
    ax.set_title(f"{fam}: MLA KV cache held by impl ({r0['mla_layers']} MLA layer(s), {r0['dtype']})", fontsize=9)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def table(rows: list[dict]) -> str:
    lines = [f"{'family':<14} {'kv':<8} {'naive B/tok':>12} {'absorbed B/tok':>15} {'naive/absorbed':>15}"]
    for fam in dict.fromkeys(r["family"] for r in rows):
        for kv in KV_MODES:
            n = next(r["bytes_per_token"] for r in rows if r["family"] == fam and r["kv"] == kv and r["form"] == "naive")
            a = next(r["bytes_per_token"] for r in rows if r["family"] == fam and r["kv"] == kv and r["form"] == "absorbed")
            lines.append(f"{fam:<14} {kv:<8} {n:>12g} {a:>15g} {n / a:>15.2f}")
    return "\n".join(lines)


def run(out: Path, names: list[str] | None = None, tokens: int = 16, backend: str = "numpy",
        dtype: str = "float32", seed: int = 0) -> list[dict]:
    try:
        Backend(backend, "cpu", dtype)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    _check_tokens(tokens)  # before the directory is made: bad input leaves nothing behind
    fams = mla_families(names)
    if not fams:
        raise UsageError("no MLA family is registered")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name, fam in fams.items():
        fam_rows = measure(fam, tokens, backend, dtype, seed)
        plot(fam_rows, out / f"{name}.png")
        rows += fam_rows
    pd.DataFrame(rows).to_csv(out / "mla_cache.csv", index=False)
    return rows


def cmd_mla_cache(a) -> int:
    out = report.check_out(a.out, f"mla-cache-{report.new_run_id()}")
    rows = run(out, a.family, a.tokens, a.backend, a.dtype, a.seed)
    print(table(rows))
    print(f"written: {out / 'mla_cache.csv'} and {len({r['family'] for r in rows})} PNG(s) in {out}", file=sys.stderr)
    # a held cache larger than its rows is a bug in impl's backings, not a figure
    bad = [r for r in rows if r["kv"] != "paged" and r["bytes_per_token"] != r["formula_bytes_per_token"]]
    return 1 if bad else 0
