"""impl on a device, proven without one.

The body runs on torch's data-less "meta" device under ``impl.device_guard``:
every torch call is checked, and a tensor anywhere but the device, an implicit
pull to the host, or a float64 tensor on a device that has none (mps) raises
``DeviceLeak``. The planted-leak tests show the guard firing on each kind of
mistake; the rest show today's body, KV caches, traces and MLA -- and every
family's layers -- run clean under it. The RoPE tables are built once per
(backend, spec) and sliced; the cuda numerics pins are set by a cuda backend
and are needed (a TF32-rounded matmul fails the float32 tolerance).

``gpu`` tests repeat the placement and the numerics on a real cuda / mps device
(scripts/device_check.sh runs them there); ``device`` marks the CPU-runnable
ones that script also runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import impl.attention as attention_mod
import impl.kv as kv_mod
import impl.rope as rope_mod
from impl import Backend
from impl.backend import CUDA_NUMERICS, _resolve, pin_cuda_numerics
from impl.device_guard import DeviceGuard, DeviceLeak, GuardedBackend
from harness.schedule import chunk_sizes
from impl.runner import load_layer
from impl.runner import run_layer as _run_layer


def run_layer(layer, xs, kv, schedule="mixed", **kw):
    """impl's runner with a named schedule (the case's job: harness/schedule.py)."""
    return _run_layer(layer, xs, kv, [chunk_sizes(schedule, int(x.shape[0])) for x in xs], **kw)
from impl.trace import Trace
from test_kernels import CASES, _gpu, _layer
from test_mla import _cfg as mla_cfg
from test_mla import _inputs as mla_inputs
from test_mla import _weights as mla_weights

KV_MODES = ("decode", "batched", "paged")
_HOST_SCALE = torch.tensor(2.0)  # a module-level constant on the host: a planted leak below
META = "meta"


def _xs(n_seq, tokens=9, hidden=48, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(tokens, hidden)) for _ in range(n_seq)]


def _run_guarded(layer, xs, kv, device=META, forbid_float64=True, schedule="mixed", source=None):
    with DeviceGuard(device, forbid_float64=forbid_float64) as g:
        outs, traces, steps = run_layer(layer, xs if kv != "decode" else xs[:1], kv, schedule, source=source)
    return g, outs, traces, steps


def _cache_tensors(steps):
    out = []
    for s in steps:
        if isinstance(s, kv_mod.Paged):
            out += [s.pool.k] + ([s.pool.v] if s.pool.v is not None else [])
        else:
            out += [t for t in (s.cache.k, s.cache.v) if t is not None]
    return out


# ------------------------------------------------------------ the body is clean
# every decoration in float32; the low-precision paths (a float32 accumulator beside
# bfloat16 arrays) on the decorations that make arrays of their own
_DTYPE_CASES = [(n, "float32") for n in sorted(CASES)] + [
    (n, "bfloat16") for n in ("plain-gqa", "sinks-window", "alibi-6-heads", "l2-post-rope-temp-nope")]


@pytest.mark.device
@pytest.mark.parametrize("name,dtype", _DTYPE_CASES)
def test_every_decoration_stays_on_the_device(name, dtype):
    _, _, layer = _layer(name, GuardedBackend("torch", META, dtype))
    for kv in KV_MODES:
        g, outs, traces, steps = _run_guarded(layer, _xs(2), kv)
        if layer.cfg.shape == "absent":
            assert outs[0] is None
            continue
        assert outs[0].shape == (9, 48)
        assert g.ops > 50 and g.tensors > 20, (g.ops, g.tensors)  # the guard saw the body's work
        caches = _cache_tensors(steps)
        assert caches or not layer.has_kv()
        assert all(t.device.type == META and t.dtype == getattr(torch, dtype) for t in caches)
        assert set(traces[0].assemble()) >= {"attn_in", "attn_out"}


@pytest.mark.device
@pytest.mark.parametrize("form", ["absorbed", "naive"])
def test_mla_stays_on_the_device(form):
    cfg = mla_cfg(form, gate=True)
    layer = load_layer(cfg, mla_weights(gate=True), GuardedBackend("torch", META, "bfloat16"))
    for kv in KV_MODES:
        with DeviceGuard(META, forbid_float64=True) as g:
            outs, traces, steps = run_layer(layer, mla_inputs(1 if kv == "decode" else 2), kv, "mixed")
        assert outs[0].shape == (11, cfg.hidden_size) and g.ops > 50
        assert all(t.device.type == META for t in _cache_tensors(steps))


def _family_params():
    from harness import families

    return [(name, v) for name, fam in families.registry().items() for v in (fam.variants or (None,))]


@pytest.mark.device
@pytest.mark.parametrize("family,variant", _family_params())
def test_every_family_stays_on_the_device(family, variant):
    from harness.case import Case, CaseRun
    from harness.families.base import NotInImpl

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from harness import families

    hf_type = families.get(family).hf_model_type
    if hf_type not in CONFIG_MAPPING_NAMES:  # an older transformers (the device check's preflight skips it too)
        pytest.skip(f"this transformers has no model type {hf_type!r}")
    run = CaseRun(Case(family=family, variant=variant), None)
    be = GuardedBackend("torch", META, "float32")
    ran = 0
    loaded = {}
    for i, (lc, w) in enumerate(zip(run.layer_cfgs, run.weights_for("float32"))):
        if isinstance(lc, NotInImpl) or getattr(lc, "shape", None) == "absent":
            continue  # nothing to run (an absent layer -- nemotron_h's MLP layers -- returns no branch)
        layer = loaded[i] = load_layer(lc, w, be)
        hidden = run.config.hidden_size
        xs = _xs(2, tokens=6, hidden=hidden)
        # a layer reading an earlier layer's K / V (gemma3n's kv_source) runs with that layer beside it
        src = getattr(lc, "kv_source", None)
        g, outs, _, _ = _run_guarded(layer, xs, "paged", source=None if src is None else (loaded[src], xs))
        assert g.ops > 0 and outs[0].shape == (6, hidden)
        ran += 1
    assert ran >= 1


# ------------------------------------------------------------ the guard fires
def _plain():
    return _layer("plain-gqa", GuardedBackend("torch", META, "float32"))[2]


def _leaky_linear(plant):
    """impl's projection with a planted mistake in front of it."""
    real = attention_mod._linear

    def leaky(xp, x, w, b=None):
        plant(xp, x)
        return real(xp, x, w, b)

    return leaky


def _host_mask(self, a):
    return torch.as_tensor(np.asarray(a, dtype=bool))  # no device=: a CPU bool tensor


# name -> (owner, attribute, the planted replacement, kv mode, what the guard says)
PLANTS = {
    # a Backend.mask that forgets the move: its CPU tensor reaches the body
    "mask-left-on-host": (Backend, "mask", _host_mask, "paged", r"__getitem__ got a \(4, 4\) torch.bool tensor on cpu"),
    # ... the same, made by the body itself
    "mask-made-on-host": (GuardedBackend, "mask", _host_mask, "paged",
                          r"as_tensor made a \(4, 4\) torch.bool tensor on cpu"),
    "page-pool-on-host": (kv_mod, "_dev", lambda backend: {}, "paged", r"zeros made a .* tensor on cpu"),
    # a trace that converts by itself instead of through Backend.to_numpy
    "trace-converts-itself": (Trace, "put", lambda self, name, a: self.rows[name].append(np.asarray(a)), "decode",
                              r"__array__\(\) pulls a tensor to the host"),
    "host-scalar-read": (attention_mod, "_linear", _leaky_linear(lambda xp, x: float(xp.max(x))), "decode",
                         r"__float__\(\) pulls"),  # a device sync
    "0-dim-host-constant": (attention_mod, "_linear", _leaky_linear(lambda xp, x: x * _HOST_SCALE), "decode",
                            r"mul got a \(\) torch.float32 tensor on cpu"),
    "0-dim-host-tensor": (attention_mod, "_linear", _leaky_linear(lambda xp, x: x * torch.tensor(2.0)), "decode",
                          r"tensor made a \(\) torch.float32 tensor on cpu"),
    "float64-on-device": (attention_mod, "_linear", _leaky_linear(lambda xp, x: xp.astype(x, xp.float64)), "decode",
                          r"made a float64 tensor"),  # mps has none
}


@pytest.mark.device
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_guard_fires_on_a_planted_leak(monkeypatch, plant):
    owner, attr, fake, kv, match = PLANTS[plant]
    layer = _plain()
    _run_guarded(layer, _xs(2), kv)  # control: the same run is clean without the plant
    monkeypatch.setattr(owner, attr, fake)
    with pytest.raises(DeviceLeak, match=match):
        _run_guarded(layer, _xs(2), kv)


@pytest.mark.device
def test_torch_alone_lets_these_through_on_meta():
    """Why the guard and not meta alone: torch accepts a 0-dim host tensor and a
    host index array against a device tensor (on cuda too: an implicit copy and
    sync), so only the guard sees them."""
    x, idx = torch.zeros(4, 3, device=META), torch.tensor([0, 2])
    assert (x * _HOST_SCALE).device.type == META
    assert x[idx].device.type == META
    with DeviceGuard(META):
        with pytest.raises(DeviceLeak, match=r"__getitem__ got a \(2,\) torch.int64 tensor on cpu"):
            x[idx]
        with pytest.raises(DeviceLeak, match=r"mul got a \(\) torch.float32 tensor on cpu"):
            x * _HOST_SCALE


def _old_asarray(self, a, dtype=None):
    """Backend.asarray before this change: the float64 -> compute-dtype rounding
    happened inside the cross-device copy."""
    dtype = self.native_dtype if dtype is None else dtype
    return torch.as_tensor(np.asarray(a, dtype=np.float64)).to(device=self.device, dtype=dtype)


def _old_to_numpy(self, a):
    """Backend.to_numpy before this change: widened to float64 inside the copy off the device."""
    return a.detach().to("cpu", dtype=torch.float64).numpy()


@pytest.mark.device
@pytest.mark.parametrize("method,old", [("asarray", _old_asarray), ("to_numpy", _old_to_numpy)])
def test_transfers_convert_float64_on_the_host(monkeypatch, method, old):
    """MPS has no float64: a copy that converts to or from it across the boundary is
    refused (or, on torch 2.14, silently writes nothing). Backend converts on the
    host side; the old one-copy transfers fire the guard."""
    x = np.random.default_rng(0).normal(size=(5, 3))
    for dt in ("float32", "bfloat16", "float16"):  # the values are what they were: rounded once
        be = Backend("torch", "cpu", dt)
        want = torch.as_tensor(x).to(getattr(torch, dt))
        assert torch.equal(be.asarray(x), want)
        assert np.array_equal(be.to_numpy(be.asarray(x)), want.double().numpy())
    layer = _plain()
    _run_guarded(layer, _xs(1), "decode", forbid_float64=True)  # today's transfers are clean
    monkeypatch.setattr(Backend, method, old)
    with pytest.raises(DeviceLeak, match=r"float64 conversion across the device boundary"):
        _run_guarded(layer, _xs(1), "decode", forbid_float64=True)


# ------------------------------------------------------------ RoPE tables: built once
@pytest.mark.device
@pytest.mark.parametrize("backend", [("numpy", "float64"), ("torch", "float32"), ("torch", "bfloat16")])
def test_rope_table_rows_equal_the_direct_computation(backend):
    be = Backend("torch" if backend[0] == "torch" else "numpy", "cpu", backend[1])
    spec = rope_mod.make_rope("yarn", 10000.0, 8, "neox", dict(factor=4.0, original_max_position_embeddings=16))
    rope_mod._TABLES.clear()
    for start, n in [(0, 9), (9, 1), (10, 1), (3, 300), (700, 2), (5, 0)]:
        pos = np.arange(start, start + n)
        got = rope_mod.cos_sin_on(be, spec, pos)
        want = [be.asarray(t) for t in rope_mod.cos_sin(spec, pos)]
        for a, b in zip(got, want):
            assert np.array_equal(be.to_numpy(a), be.to_numpy(b))  # bit for bit
    odd = np.array([4, 2, 9])  # not contiguous: computed afresh, same values
    for a, b in zip(rope_mod.cos_sin_on(be, spec, odd), [be.asarray(t) for t in rope_mod.cos_sin(spec, odd)]):
        assert np.array_equal(be.to_numpy(a), be.to_numpy(b))


@pytest.mark.device
def test_rope_table_is_uploaded_once_per_layer_not_per_step(monkeypatch):
    calls = []
    real = rope_mod.cos_sin
    monkeypatch.setattr(rope_mod, "cos_sin", lambda spec, pos: calls.append(len(pos)) or real(spec, pos))
    rope_mod._TABLES.clear()
    _, _, layer = _layer("plain-gqa", GuardedBackend("torch", META, "float32"))
    with DeviceGuard(META) as g:
        run_layer(layer, _xs(1, tokens=40), "decode", "decode")  # 40 one-row calls
    assert calls == [256], calls  # one table for positions 0..255, then slices
    run_layer(layer, _xs(1, tokens=300), "decode", "prefill")  # past the table: it doubles, once
    assert calls == [256, 512], calls
    assert g.ops > 0


@pytest.mark.device
def test_rope_table_follows_a_replaced_builder(monkeypatch):
    """A mutant swaps impl.rope.cos_sin at run time (harness/mutants): the cached
    table must not hide it, and the original's table is served again afterwards."""
    be = Backend("torch", "cpu", "float32")
    spec = rope_mod.make_rope("default", 10000.0, 8)
    pos = np.arange(3, 7)
    clean = [be.to_numpy(t) for t in rope_mod.cos_sin_on(be, spec, pos)]
    real = rope_mod.cos_sin
    monkeypatch.setattr(rope_mod, "cos_sin", lambda s, p: tuple(2 * t for t in real(s, p)))
    assert np.array_equal(be.to_numpy(rope_mod.cos_sin_on(be, spec, pos)[0]), 2 * clean[0])
    monkeypatch.undo()
    assert np.array_equal(be.to_numpy(rope_mod.cos_sin_on(be, spec, pos)[0]), clean[0])


# ------------------------------------------------------------ cuda numerics
@pytest.fixture
def restore_cuda_numerics():
    saved = {k: _read(k) for k in CUDA_NUMERICS}
    yield
    for k, v in saved.items():
        owner, attr = k.rsplit(".", 1)
        setattr(_resolve(torch, owner), attr, v)


def _read(dotted):
    owner, attr = dotted.rsplit(".", 1)
    return getattr(_resolve(torch, owner), attr)


@pytest.mark.device
def test_a_cuda_backend_pins_the_numerics_and_a_cpu_one_does_not(restore_cuda_numerics):
    m = torch.backends.cuda.matmul
    m.allow_tf32 = True
    m.allow_bf16_reduced_precision_reduction = True
    _ = Backend("torch", "cpu", "float32").xp
    assert m.allow_tf32 and m.allow_bf16_reduced_precision_reduction  # the CPU backend leaves them be
    _ = Backend("torch", "cuda", "bfloat16").xp  # no GPU needed: these are process settings
    assert {k: _read(k) for k in CUDA_NUMERICS} == CUDA_NUMERICS
    assert pin_cuda_numerics()["torch.get_float32_matmul_precision()"] == "highest"


def _tf32(a: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32 (10 explicit mantissa bits, nearest): what cuBLAS does
    to matmul inputs when allow_tf32 is on."""
    bits = a.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.device
def test_tf32_would_fail_the_float32_tolerance(monkeypatch, policy):
    """The pin is not decoration: the float32 policy (what a cuda float32 case is
    judged by) passes impl's float32 and fails the same body with TF32 matmuls."""
    from harness.compare import judge, metrics

    tol, _ = policy.tolerance("float32", "attn_out", "llama", "hf")
    xs = _xs(1, tokens=12)
    want = run_layer(_layer("plain-gqa")[2], xs, "decode", "mixed")[0][0]
    layer32 = _layer("plain-gqa", Backend("torch", "cpu", "float32"))[2]
    ok = run_layer(layer32, xs, "decode", "mixed")[0][0]
    assert judge(metrics(ok, want, "attn_out"), tol)[0] == "pass"
    real = attention_mod._linear
    monkeypatch.setattr(attention_mod, "_linear", lambda xp, x, w, b=None: real(xp, _tf32(x), _tf32(w), b))
    rounded = run_layer(layer32, xs, "decode", "mixed")[0][0]
    assert judge(metrics(rounded, want, "attn_out"), tol)[0] == "fail"


# ------------------------------------------------------------ on a real device
@pytest.mark.gpu
@pytest.mark.skipif(_gpu() is None, reason="no cuda or mps device on this machine")
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_body_stays_on_the_device_and_matches_cpu(name):
    dev = _gpu()
    _, _, lcpu = _layer(name, Backend("torch", "cpu", "float32"))
    _, _, lgpu = _layer(name, GuardedBackend("torch", dev, "float32"))
    for kv in KV_MODES:
        a = run_layer(lcpu, _xs(2) if kv != "decode" else _xs(1), kv, "mixed")[0]
        g, b, _, steps = _run_guarded(lgpu, _xs(2), kv, device=dev, forbid_float64=dev == "mps")
        assert all(t.device.type == dev for t in _cache_tensors(steps))
        for x, y in zip(a, b):
            if x is not None:
                np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(_gpu() is None, reason="no cuda or mps device on this machine")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["plain-gqa", "sinks-window", "alibi-6-heads", "output-gate-subnorm"])
def test_gpu_low_precision_is_judged_like_the_cpu(name, dtype, policy):
    """The rule a low-precision GPU case is judged by (fixtures/tolerance.toml): its
    NMSE to the float64 oracle at most ``ratio`` x a reference's -- here the same body
    on the CPU in the same dtype stands in for the reference."""
    from harness.compare import judge_against_oracle, metrics

    dev = _gpu()
    xs = _xs(1, tokens=12)
    oracle = run_layer(_layer(name)[2], xs, "decode", "mixed")[0][0]
    cpu = run_layer(_layer(name, Backend("torch", "cpu", dtype))[2], xs, "decode", "mixed")[0][0]
    gpu = run_layer(_layer(name, Backend("torch", dev, dtype))[2], xs, "decode", "mixed")[0][0]
    tol, _ = policy.tolerance(dtype, "attn_out", "llama", "hf")
    status, reason = judge_against_oracle(metrics(gpu, oracle, "attn_out"), metrics(cpu, oracle, "attn_out"), tol)
    assert status == "pass", reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no cuda device on this machine")
def test_cuda_runs_with_the_numerics_pinned():
    be = Backend("torch", "cuda", "float32")
    _ = be.xp
    assert {k: _read(k) for k in CUDA_NUMERICS} == CUDA_NUMERICS
