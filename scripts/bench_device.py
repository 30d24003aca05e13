"""Time one real-size attention layer: impl against torch's scaled_dot_product_attention.

    python scripts/bench_device.py --device cuda [--dtype bfloat16] [--size real|small] [--out DIR]

The plain arm (llama's attention: RMS input norm, GQA, neox RoPE, no bias) at
the size the device check asks for -- hidden 4096, 32 heads, 8 KV heads,
head_dim 128, a 4096-token prefill then 256 one-token decode steps -- through
impl's one body (``impl.attention.attn_block``) in every KV mode (decode,
batched, paged), and through a straight torch layer on the SAME device, dtype,
weights and inputs whose attention is ``F.scaled_dot_product_attention``
(causal prefill, then each decode row against a preallocated KV cache). impl
runs without a trace (no probe leaves the device); the inputs are uploaded once.

Printed and written to OUT/bench.json and OUT/bench.md: per KV mode, the
prefill time, the decode time per step, the total, SDPA's, the ratio
impl/SDPA (the goal: within 1.5x for the plain arm), and how far impl's output
is from SDPA's (NMSE). A timing of two different computations means nothing,
so outputs that disagree beyond the dtype's bound exit 1; the ratio itself is
reported, not enforced (exit 0 whether the goal is met or not).

``--size small`` (the default on cpu) is a CPU-sized layer, so CI runs the same
code path in seconds: hidden 256, 4 heads, 2 KV heads, head_dim 64, 256
tokens, 16 decode steps. Its ratios say nothing about a GPU: on a CPU both
arms are bound by the same matmuls, and a loaded machine moves them by 2x.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without an install (the device machine)
    sys.path.insert(0, str(ROOT))

SIZES = {
    "real": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, tokens=4096, decode=256),
    "small": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, tokens=256, decode=16),
}
KV_MODES = ("decode", "batched", "paged")
# impl vs SDPA, NMSE over the layer's output: the two differ by summation order,
# SDPA's fused softmax and (low precision) where each rounds the probabilities.
AGREE = {"float32": 1e-8, "float16": 1e-4, "bfloat16": 1e-3}
GOAL = 1.5
ROPE_THETA = 500000.0  # llama 3's
EPS = 1e-5


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, mps or cpu (default cuda)")
    p.add_argument("--dtype", default=None, help="float32, float16, bfloat16 (default bfloat16 on a GPU, float32 on cpu)")
    p.add_argument("--size", default=None, choices=sorted(SIZES), help="real (default on a GPU) or small (default on cpu)")
    p.add_argument("--kv-modes", default=",".join(KV_MODES), help="comma list of decode, batched, paged")
    p.add_argument("--page-size", type=int, default=16, help="rows per page in the paged mode (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per arm; the fastest counts (default 3)")
    p.add_argument("--out", default=None, help="write bench.json / bench.md here")
    for k in SIZES["real"]:
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=None, help=f"override the size's {k}")
    return p.parse_args(argv)


def fail(msg: str, code: int = 2):
    print(f"bench_device: error: {msg}", file=sys.stderr)
    sys.exit(code)


def main(argv=None) -> int:
    a = parse(argv)
    import torch

    from impl import Backend, LayerConfig, NormSpec, make_rope
    from impl.attention import Layer
    from impl.config import ConfigError

    gpu = a.device in ("cuda", "mps")
    dtype = a.dtype or ("bfloat16" if gpu else "float32")
    size = dict(SIZES[a.size or ("real" if gpu else "small")])
    for k in size:
        if getattr(a, k) is not None:
            size[k] = getattr(a, k)
    modes = [m.strip() for m in a.kv_modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in KV_MODES]
    if bad or not modes:
        fail(f"unknown kv mode(s) {', '.join(bad) or '(none)'}; valid: {', '.join(KV_MODES)}")
    if dtype not in AGREE:
        fail(f"unknown dtype {dtype!r}; valid: {', '.join(AGREE)}")
    be = Backend("torch", a.device, dtype)
    try:
        be.check_available()
    except ConfigError as e:
        fail(str(e))
    if a.repeat < 1:
        fail(f"--repeat must be at least 1, got {a.repeat}")
    if size["heads"] % size["kv_heads"]:
        fail(f"--heads {size['heads']} is not a multiple of --kv-heads {size['kv_heads']}")

    hid, H, Hkv, d, T, D = (size[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "tokens", "decode"))
    cfg = LayerConfig(hidden_size=hid, n_heads=H, n_kv_heads=Hkv, head_dim=d,
                      rope=make_rope("default", ROPE_THETA, d, "neox"), input_norm=NormSpec("rms", EPS))
    rng = np.random.default_rng(a.seed)
    w = {"attn_norm": (1 + 0.1 * rng.standard_normal(hid)).astype(np.float32)}
    for name, shape in (("wq", (H * d, hid)), ("wk", (Hkv * d, hid)), ("wv", (Hkv * d, hid)), ("wo", (hid, H * d))):
        w[name] = (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[1]))
    x_host = rng.standard_normal((T + D, hid), dtype=np.float32)

    sync = {"cuda": torch.cuda.synchronize, "mps": getattr(torch.mps, "synchronize", lambda: None)}.get(
        a.device, lambda: None)
    layer = Layer.load(cfg, w, be)
    x = be.asarray(x_host)  # one upload; every arm reads the same device rows
    sdpa = SdpaLayer(cfg, layer, be)

    def timed(fn):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        return out, time.perf_counter() - t

    # warm-up: kernels, cuBLAS handles and allocator pools, outside the timings
    warm = min(T, 64)
    for m in modes:
        impl_arm(layer, x[: warm + 2], warm, 2, m, a.page_size)
    sdpa.run(x[: warm + 2], warm, 2)
    sync()

    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    # Every arm once per round, rounds repeated: a disturbance (another process, a
    # clock change) hits all arms alike; each arm's fastest prefill and decode count.
    # Fresh caches every run.
    arms = {"sdpa": lambda: SdpaRun(sdpa, x, T, D)}
    arms.update({m: (lambda m=m: ImplRun(layer, x, T, D, m, a.page_size)) for m in modes})
    fastest = {name: [math.inf, math.inf] for name in arms}
    outs = {}
    for _ in range(a.repeat):
        for name, make in arms.items():
            run = make()
            pre, tp = timed(run.prefill)
            dec, td = timed(run.decode_all)
            fastest[name] = [min(fastest[name][0], tp), min(fastest[name][1], td)]
            outs[name] = (pre, dec)
            del run
    s_pre, s_dec = outs["sdpa"]
    s_t_pre, s_t_dec = fastest["sdpa"]
    results = []
    for m in modes:
        (pre, dec), (t_pre, t_dec) = outs[m], fastest[m]
        results.append(dict(kv_mode=m, impl_prefill_s=t_pre, impl_decode_s=t_dec, impl_total_s=t_pre + t_dec,
                            sdpa_prefill_s=s_t_pre, sdpa_decode_s=s_t_dec, sdpa_total_s=s_t_pre + s_t_dec,
                            ratio_prefill=t_pre / s_t_pre, ratio_decode=t_dec / s_t_dec,
                            ratio_total=(t_pre + t_dec) / (s_t_pre + s_t_dec),
                            nmse_prefill=nmse(be, pre, s_pre), nmse_decode=nmse(be, dec, s_dec)))
    info = dict(device=a.device, device_name=device_name(torch, a.device), dtype=dtype, torch=torch.__version__,
                size=size, page_size=a.page_size, repeat=a.repeat, arm="plain (llama: rms norm, GQA, neox RoPE)",
                agree_nmse=AGREE[dtype], goal_ratio=GOAL,
                peak_gib=(torch.cuda.max_memory_allocated() / 2**30) if a.device == "cuda" else None,
                numerics=numerics(torch, a.device))
    table = render(info, results)
    print(table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
        (out / "bench.md").write_text(table + "\n")
    bad = [r for r in results if max(r["nmse_prefill"], r["nmse_decode"]) > AGREE[dtype]]
    if bad:
        print(f"bench_device: impl and SDPA disagree beyond nmse {AGREE[dtype]:g} in kv mode(s) "
              f"{', '.join(r['kv_mode'] for r in bad)}: the timings compare different computations", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- impl's arm
def _steps(layer, kv_mode, rows, page_size):
    from impl import kv as kvmod

    if kv_mode == "paged":
        pool = kvmod.PagePool(layer.backend, -(-rows // page_size) + 1, page_size, *layer.kv_row_shapes())
        return kvmod.Paged(kvmod.PagedSeq([]), pool)
    return kvmod.KV_MODES[kv_mode](kvmod.ContiguousKv(layer.backend))


class ImplRun:
    """One sequence through impl's body as the engine drives it (impl.runner's
    order: reserve pages, then the body), without a trace and without a host copy
    per step -- the outputs stay on the device until the comparison."""

    def __init__(self, layer, x, prefill: int, decode: int, kv_mode: str, page_size: int):
        self.layer, self.x, self.T, self.D = layer, x, prefill, decode
        self.kv_mode = kv_mode
        self.step = _steps(layer, kv_mode, prefill + decode, page_size)

    def _one(self, rows):
        from impl import kv as kvmod

        if isinstance(self.step, kvmod.Paged):
            self.step.pool.reserve(self.step.seq, rows.shape[0])
        return self.layer.block(rows, self.step, None)[0]

    def prefill(self):
        return self._one(self.x[: self.T])

    def decode_all(self):
        xp = self.layer.backend.xp
        return xp.concat([self._one(self.x[self.T + i : self.T + i + 1]) for i in range(self.D)], axis=0)


def impl_arm(layer, x, prefill, decode, kv_mode, page_size):
    run = ImplRun(layer, x, prefill, decode, kv_mode, page_size)
    return run.prefill(), run.decode_all()


# ---------------------------------------------------------------- SDPA's arm
class SdpaLayer:
    """The same layer written the usual torch way: HF LlamaRMSNorm, F.linear, a
    rotate-half RoPE from the same float64 table, a preallocated KV cache, and
    ``F.scaled_dot_product_attention`` (GQA through ``enable_gqa``)."""

    def __init__(self, cfg, layer, be):
        import torch

        self.torch, self.cfg, self.be = torch, cfg, be
        self.w = layer.w  # the same device tensors impl holds
        self.H, self.Hkv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.k = self.v = None

    def _norm(self, x):
        t = self.torch
        xf = x.to(t.float32)
        y = xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
        return y.to(x.dtype) * self.w["attn_norm"]

    def _rope(self, t_, p0):
        from impl import rope as ropemod

        n = t_.shape[-2]
        cos, sin = ropemod.cos_sin_on(self.be, self.cfg.rope, np.arange(p0, p0 + n))
        cos = self.torch.cat([cos, cos], dim=-1)[None, None]
        sin = self.torch.cat([sin, sin], dim=-1)[None, None]
        half = self.d // 2
        rot = self.torch.cat([-t_[..., half:], t_[..., :half]], dim=-1)
        return t_ * cos + rot * sin

    def _qkv(self, x, p0):
        F = self.torch.nn.functional
        n = x.shape[0]
        h = self._norm(x)
        q = F.linear(h, self.w["wq"]).view(1, n, self.H, self.d).transpose(1, 2)
        k = F.linear(h, self.w["wk"]).view(1, n, self.Hkv, self.d).transpose(1, 2)
        v = F.linear(h, self.w["wv"]).view(1, n, self.Hkv, self.d).transpose(1, 2)
        return self._rope(q, p0), self._rope(k, p0), v

    def _attend(self, q, k, v, causal):
        F = self.torch.nn.functional
        try:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:  # a torch before enable_gqa (2.5)
            rep = self.H // self.Hkv
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                               is_causal=causal)
        return F.linear(o.transpose(1, 2).reshape(q.shape[2], self.H * self.d), self.w["wo"])

    def reserve(self, rows):
        """The KV cache for ``rows`` positions, allocated before the timed work."""
        t = self.torch
        dt, dev = self.w["wk"].dtype, self.w["wk"].device
        self.k = t.empty((1, self.Hkv, rows, self.d), dtype=dt, device=dev)
        self.v = t.empty_like(self.k)

    def prefill(self, x):
        n = x.shape[0]
        q, k, v = self._qkv(x, 0)
        self.k[:, :, :n], self.v[:, :, :n] = k, v
        return self._attend(q, k, v, True)

    def decode_all(self, x, start, steps):
        outs = []
        for p in range(start, start + steps):
            q, k, v = self._qkv(x[p : p + 1], p)
            self.k[:, :, p : p + 1], self.v[:, :, p : p + 1] = k, v
            outs.append(self._attend(q, self.k[:, :, : p + 1], self.v[:, :, : p + 1], False))
        return self.torch.cat(outs, dim=0)

    def run(self, x, prefill, decode):
        self.reserve(prefill + decode)
        return self.prefill(x[:prefill]), self.decode_all(x, prefill, decode)


class SdpaRun:
    """One sequence through the SDPA layer, its cache allocated before the timings."""

    def __init__(self, sdpa, x, prefill, decode):
        self.sdpa, self.x, self.T, self.D = sdpa, x, prefill, decode
        sdpa.reserve(prefill + decode)

    def prefill(self):
        return self.sdpa.prefill(self.x[: self.T])

    def decode_all(self):
        return self.sdpa.decode_all(self.x, self.T, self.D)


# ---------------------------------------------------------------- reporting
def nmse(be, a, b) -> float:
    a, b = be.to_numpy(a), be.to_numpy(b)
    return float(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-300))


def device_name(torch, device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "mps":
        return "Apple MPS"
    import platform

    return platform.processor() or platform.machine()


def numerics(torch, device):
    if device != "cuda":
        return {}
    from impl.backend import pin_cuda_numerics

    return pin_cuda_numerics()


def render(info, results) -> str:
    s = info["size"]
    lines = [
        f"bench: impl vs F.scaled_dot_product_attention -- {info['arm']}",
        f"device {info['device']} ({info['device_name']}), torch {info['torch']}, {info['dtype']}; hidden {s['hidden']}, "
        f"heads {s['heads']}/{s['kv_heads']} KV, head_dim {s['head_dim']}; prefill {s['tokens']} tokens, then "
        f"{s['decode']} decode steps; page size {info['page_size']}; fastest of {info['repeat']}"
        + (f"; peak {info['peak_gib']:.1f} GiB" if info.get("peak_gib") is not None else ""),
        "",
        "| kv mode | impl prefill ms | SDPA prefill ms | impl decode ms/step | SDPA decode ms/step | impl total s "
        "| SDPA total s | impl/SDPA | nmse prefill | nmse decode |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    D = max(s["decode"], 1)
    for r in results:
        lines.append(
            f"| {r['kv_mode']} | {1e3 * r['impl_prefill_s']:.1f} | {1e3 * r['sdpa_prefill_s']:.1f} | "
            f"{1e3 * r['impl_decode_s'] / D:.2f} | {1e3 * r['sdpa_decode_s'] / D:.2f} | {r['impl_total_s']:.3f} | "
            f"{r['sdpa_total_s']:.3f} | {r['ratio_total']:.2f}x | {r['nmse_prefill']:.1e} | {r['nmse_decode']:.1e} |")
    lines.append("")
    for r in results:
        met = "met" if r["ratio_total"] <= info["goal_ratio"] else "NOT met"
        lines.append(f"plain arm, kv {r['kv_mode']}: impl/SDPA = {r['ratio_total']:.2f}x (prefill "
                     f"{r['ratio_prefill']:.2f}x, decode {r['ratio_decode']:.2f}x); goal <= {info['goal_ratio']}x: {met}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
