"""impl against independent float64 formulas written here, and impl against itself
across schedules, KV backings and backends.

The formulas below are deliberately written the plain way (loops over heads and
queries, complex numbers for RoPE) so they share no code and no vectorisation
trick with impl's one body."""

from __future__ import annotations

import math

import numpy as np
import pytest

from impl import (Backend, LayerConfig, NormSpec, QkNormSpec, TemperatureSpec, WindowSpec, alibi_slopes,
                  make_rope)
from impl.attention import Layer
from impl.kv import ContiguousKv, Decode, KvError, Paged, PagedSeq, PagePool
from impl.norms import normalize
from impl.rope import cos_sin, rotate
from impl.runner import run_layer

RNG = np.random.default_rng(1234)


# ----------------------------------------------------------------- formulas
def ref_rms(x, w=None, eps=1e-6, plus1=False):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    if w is None:
        return y
    return y * (1 + w) if plus1 else y * w


def ref_layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def ref_rope(x, pos, inv_freq, layout, rot):
    """x[n, h, d]; rotation by complex multiplication, one pair at a time."""
    out = x.copy()
    half = rot // 2
    for t in range(x.shape[0]):
        for i in range(half):
            z = np.exp(1j * pos[t] * inv_freq[i])
            if layout == "neox":
                a, b = x[t, :, i], x[t, :, i + half]
            else:
                a, b = x[t, :, 2 * i], x[t, :, 2 * i + 1]
            c = (a + 1j * b) * z
            if layout == "neox":
                out[t, :, i], out[t, :, i + half] = c.real, c.imag
            else:
                out[t, :, 2 * i], out[t, :, 2 * i + 1] = c.real, c.imag
    return out


def ref_attention(q, k, v, scale, *, window=None, softcap=None, sinks=None, slopes=None):
    """q[n, H, D], k[n, Hkv, D], v[n, Hkv, Dv], positions 0..n-1; loops, no vectorisation."""
    n, H, _ = q.shape
    hkv = k.shape[1]
    out = np.zeros((n, H, v.shape[2]))
    probs = np.zeros((H, n, n))
    for h in range(H):
        g = h // (H // hkv)
        for t in range(n):
            logits = []
            for j in range(n):
                visible = j <= t
                if window is not None:
                    lo = t - window.size + 1 if window.kind == "sliding" else (t // window.size) * window.size
                    visible = visible and j >= lo
                if not visible:
                    logits.append(-math.inf)
                    continue
                s = float(q[t, h] @ k[j, g]) * scale
                if softcap is not None and sinks is None:
                    s = softcap * math.tanh(s / softcap)
                if slopes is not None:
                    s += slopes[h] * (j - t)
                logits.append(s)
            logits = np.array(logits)
            m = logits.max() if sinks is None else max(logits.max(), sinks[h])
            e = np.exp(logits - m)
            denom = e.sum() + (0.0 if sinks is None else math.exp(sinks[h] - m))
            p = e / denom
            probs[h, t] = p
            out[t, h] = p @ v[:, g]
    return out, probs


def sig(x):
    return 1 / (1 + np.exp(-x))


def ref_layer(cfg: LayerConfig, w: dict, x: np.ndarray):
    """The whole attention half of one layer, in the spec's order, plainly."""
    n = x.shape[0]
    if cfg.shape == "absent":
        return None, x
    if cfg.input_norm.kind == "layer":
        a = ref_layernorm(x, w["attn_norm"], w.get("attn_norm_b", 0.0), cfg.input_norm.eps)
    elif cfg.input_norm.kind == "none":
        a = x
    else:
        a = ref_rms(x, w.get("attn_norm"), cfg.input_norm.eps, cfg.input_norm.kind == "rms1p")
    if cfg.shape == "linear":
        return a @ w["wo"].T, x + a @ w["wo"].T
    H, Hkv, D, Dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    q = a @ w["wq"].T + w.get("bq", 0.0)
    k = a @ w["wk"].T + w.get("bk", 0.0)
    v = a @ w["wv"].T + w.get("bv", 0.0)
    gate = None
    if cfg.q_gate == "interleaved":
        qg = q.reshape(n, H, 2 * D)
        q, gate = qg[..., :D].reshape(n, H * D), qg[..., D:].reshape(n, H * D)
    if cfg.qkv_clamp is not None:
        q, k, v = (np.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k, v))
    q, k, v = q.reshape(n, H, D), k.reshape(n, Hkv, D), v.reshape(n, Hkv, Dv)

    def qk_norm(q, k):
        s = cfg.qk_norm
        if s.over == "head":
            return (ref_rms(q, w.get("q_norm"), s.norm.eps, s.norm.kind == "rms1p"),
                    ref_rms(k, w.get("k_norm"), s.norm.eps, s.norm.kind == "rms1p"))
        return (ref_rms(q.reshape(n, -1), w.get("q_norm"), s.norm.eps).reshape(q.shape),
                ref_rms(k.reshape(n, -1), w.get("k_norm"), s.norm.eps).reshape(k.shape))

    pos = np.arange(n)
    if cfg.qk_norm is not None and cfg.qk_norm.where == "pre_rope":
        q, k = qk_norm(q, k)
    if cfg.rope is not None:
        f = np.array(cfg.rope.inv_freq)
        q = ref_rope(q, pos, f, cfg.rope.layout, cfg.rope.rotary_dim)
        k = ref_rope(k, pos, f, cfg.rope.layout, cfg.rope.rotary_dim)
        r = cfg.rope.rotary_dim
        q[..., :r] *= cfg.rope.attention_factor
        k[..., :r] *= cfg.rope.attention_factor
    if cfg.qk_norm is not None and cfg.qk_norm.where == "post_rope":
        q, k = qk_norm(q, k)
    if cfg.temperature is not None:
        t = cfg.temperature
        q = q * (np.log1p(np.floor((pos + 1) / t.floor_scale)) * t.attn_scale + 1)[:, None, None]
    slopes = alibi_slopes(H, cfg.alibi_max_bias) if cfg.alibi_max_bias is not None else None
    heads, _ = ref_attention(q, k, v, cfg.softmax_scale, window=cfg.window, softcap=cfg.softcap,
                             sinks=w.get("sinks"), slopes=slopes)
    b = heads.reshape(n, H * Dv)
    if gate is not None:
        b = b * sig(gate)
    if cfg.q_gate == "separate":
        b = b * sig(a @ w["wg"].T)
    if cfg.sub_norm is not None:
        b = ref_rms(b, w["sub_norm"], cfg.sub_norm.eps)
    o = b @ w["wo"].T
    if cfg.o_scale is not None:
        o = o * cfg.o_scale
    if "bo" in w:
        o = o + w["bo"]
    if cfg.value_scale is not None:
        o = o * cfg.value_scale
    if cfg.post_norm is not None:
        o = ref_rms(o, w["post_norm"], cfg.post_norm.eps, cfg.post_norm.kind == "rms1p")
    if cfg.residual == "parallel":
        return o, None
    return o, x + o * cfg.residual_multiplier


# ----------------------------------------------------------------- configs
def weights_for(cfg: LayerConfig, *, biases=False, qk=False, sinks=False, gate=False, sub=False, obias=False,
                post=False, rng=RNG):
    hid, H, Hkv, D, Dv = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    s = 1 / math.sqrt(hid)
    qw = H * D * (2 if cfg.q_gate == "interleaved" else 1)
    w = {"attn_norm": 1 + 0.1 * rng.normal(size=hid), "wq": rng.normal(size=(qw, hid)) * s,
         "wk": rng.normal(size=(Hkv * D, hid)) * s, "wv": rng.normal(size=(Hkv * Dv, hid)) * s,
         "wo": rng.normal(size=(hid, H * Dv)) / math.sqrt(H * Dv)}
    if cfg.input_norm.kind == "layer":
        w["attn_norm_b"] = 0.1 * rng.normal(size=hid)
    if biases:
        w.update(bq=0.1 * rng.normal(size=qw), bk=0.1 * rng.normal(size=Hkv * D), bv=0.1 * rng.normal(size=Hkv * Dv))
    if qk:
        width = (D, D) if cfg.qk_norm.over == "head" else (H * D, Hkv * D)
        w.update(q_norm=1 + 0.1 * rng.normal(size=width[0]), k_norm=1 + 0.1 * rng.normal(size=width[1]))
    if sinks:
        w["sinks"] = rng.normal(size=H)
    if gate:
        w["wg"] = rng.normal(size=(H * Dv, hid)) * s
    if sub:
        w["sub_norm"] = 1 + 0.1 * rng.normal(size=H * Dv)
    if obias:
        w["bo"] = 0.1 * rng.normal(size=hid)
    if post:
        w["post_norm"] = 0.1 * rng.normal(size=hid) + (0.0 if cfg.post_norm.kind == "rms1p" else 1.0)
    return w


BASE = dict(hidden_size=48, n_heads=6, n_kv_heads=2, head_dim=8)


def rope8(layout="neox", rot=8, kind="default", **p):
    return make_rope(kind, 10000.0, rot, layout, p)


CASES = {
    "plain-gqa": (LayerConfig(**BASE, rope=rope8()), {}),
    "mqa-interleaved": (LayerConfig(**{**BASE, "n_kv_heads": 1}, rope=rope8("interleaved")), {}),
    "bias-clamp-partial": (LayerConfig(**BASE, rope=rope8(rot=4), qkv_clamp=0.6), {"biases": True}),
    "qk-head-rms1p": (LayerConfig(**BASE, rope=rope8(), input_norm=NormSpec("rms1p", 1e-6),
                                  qk_norm=QkNormSpec(NormSpec("rms1p", 1e-6), "head")), {"qk": True}),
    "qk-row": (LayerConfig(**BASE, rope=rope8(), qk_norm=QkNormSpec(NormSpec("rms", 1e-6), "row")), {"qk": True}),
    "l2-post-rope-temp-nope": (LayerConfig(**BASE, rope=None, temperature=TemperatureSpec(3.0, 0.1),
                                           qk_norm=QkNormSpec(NormSpec("l2", 1e-6), "head", "post_rope")), {}),
    "yarn": (LayerConfig(**BASE, rope=rope8(kind="yarn", factor=4.0, original_max_position_embeddings=16)), {}),
    "sliding-softcap-scale": (LayerConfig(**BASE, rope=rope8(), window=WindowSpec("sliding", 3), softcap=2.0,
                                          scale=0.5), {}),
    "chunked": (LayerConfig(**BASE, rope=rope8(), window=WindowSpec("chunked", 4)), {}),
    "sinks-window": (LayerConfig(**BASE, rope=rope8(), window=WindowSpec("sliding", 4), softcap=3.0),
                     {"sinks": True}),
    "alibi-6-heads": (LayerConfig(**BASE, rope=None, alibi_max_bias=8.0, input_norm=NormSpec("layer", 1e-5)), {}),
    "interleaved-gate": (LayerConfig(**BASE, rope=rope8(), q_gate="interleaved"), {}),
    "output-gate-subnorm": (LayerConfig(**BASE, rope=rope8(), q_gate="separate", sub_norm=NormSpec("rms", 1e-5)),
                            {"gate": True, "sub": True}),
    "obias-oscale-vscale-post": (LayerConfig(**BASE, rope=rope8(), o_scale=0.7, value_scale=1.3,
                                             post_norm=NormSpec("rms1p", 1e-6), residual_multiplier=0.5),
                                 {"obias": True, "post": True}),
    "v-width": (LayerConfig(**BASE, v_head_dim=12, rope=rope8()), {}),
    "parallel": (LayerConfig(**BASE, rope=rope8(), residual="parallel", input_norm=NormSpec("layer", 1e-5)), {}),
    "linear": (LayerConfig(hidden_size=48, shape="linear"), {}),
    "absent": (LayerConfig(hidden_size=48, shape="absent"), {}),
}


def _layer(name, backend=Backend("numpy", "cpu", "float64")):
    cfg, opts = CASES[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    w = weights_for(cfg, rng=rng, **opts) if cfg.shape == "gqa" else (
        {"attn_norm": 1 + 0.1 * rng.normal(size=48), "wo": rng.normal(size=(48, 48)) / 7} if cfg.shape == "linear" else {})
    return cfg, w, Layer.load(cfg, w, backend)


# ----------------------------------------------------------------- tests
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_plain_formula(name):
    cfg, w, layer = _layer(name)
    x = RNG.normal(size=(11, 48))
    outs, traces, _ = run_layer(layer, [x], "decode", "prefill")
    want_branch, want_resid = ref_layer(cfg, w, x)
    if want_branch is None:
        assert outs[0] is None
        return
    np.testing.assert_allclose(outs[0], want_branch, rtol=1e-10, atol=1e-10)
    got = traces[0].assemble()
    if want_resid is not None:
        np.testing.assert_allclose(got["resid_mid"], want_resid, rtol=1e-10, atol=1e-10)


def test_attention_probs_match_formula():
    cfg, w, layer = _layer("sinks-window")
    x = RNG.normal(size=(9, 48))
    _, traces, _ = run_layer(layer, [x], "decode", "decode")
    got = traces[0].assemble()
    # recompute the formula's probabilities from impl's own q_rope / k_rope
    _, probs = ref_attention(got["q_rope"], got["k_rope"], got["v"], cfg.softmax_scale, window=cfg.window,
                             softcap=cfg.softcap, sinks=w["sinks"])
    np.testing.assert_allclose(got["attn_probs"], probs, rtol=1e-10, atol=1e-12)
    # a sink takes mass: rows sum to less than one
    assert (got["attn_probs"].sum(-1) < 1 - 1e-6).all()


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
@pytest.mark.parametrize("rot", [8, 4])
def test_rope_matches_complex_rotation(layout, rot):
    spec = make_rope("default", 500.0, rot, layout)
    x = RNG.normal(size=(7, 3, 8))
    pos = np.arange(3, 10)
    c, s = cos_sin(spec, pos)
    import array_api_compat.numpy as xp

    got = rotate(xp, x, c, s, layout, rot)
    np.testing.assert_allclose(got, ref_rope(x, pos, np.array(spec.inv_freq), layout, rot), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[..., rot:], x[..., rot:])


def test_norms_match_formulas():
    import array_api_compat.numpy as xp

    x = RNG.normal(size=(5, 16))
    w, b = RNG.normal(size=16), RNG.normal(size=16)
    np.testing.assert_allclose(normalize(xp, x, NormSpec("rms", 1e-5), w), ref_rms(x, w, 1e-5), rtol=1e-12)
    np.testing.assert_allclose(normalize(xp, x, NormSpec("rms1p", 1e-5), w), ref_rms(x, w, 1e-5, True), rtol=1e-12)
    np.testing.assert_allclose(normalize(xp, x, NormSpec("layer", 1e-5), w, b), ref_layernorm(x, w, b, 1e-5),
                               rtol=1e-12)
    np.testing.assert_allclose(normalize(xp, x, NormSpec("l2", 1e-5)), ref_rms(x, None, 1e-5), rtol=1e-12)


def test_alibi_slopes_non_power_of_two():
    # HF bloom build_alibi_tensor for 6 heads: 4 powers of 2^-2, then odd powers of 2^-1
    want = [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    np.testing.assert_allclose(alibi_slopes(6, 8.0), want)
    np.testing.assert_allclose(alibi_slopes(4, 8.0), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8])


@pytest.mark.parametrize("name", ["plain-gqa", "sinks-window", "chunked", "interleaved-gate", "v-width", "alibi-6-heads"])
@pytest.mark.parametrize("backend", [("numpy", "float64"), ("numpy", "float32"), ("torch", "float32")])
def test_prefill_equals_decode_in_every_kv_mode(name, backend):
    be = Backend(backend[0], "cpu", backend[1])
    cfg, w, layer = _layer(name, be)
    xs = [RNG.normal(size=(13, 48)) for _ in range(2)]
    base, _, _ = run_layer(layer, xs, "batched", "prefill")
    tol = 1e-12 if backend[1] == "float64" else 2e-5
    for kv in ("decode", "batched", "paged"):
        for sched in ("prefill", "decode", "mixed", "3,1,4,5"):
            outs, _, _ = run_layer(layer, xs, kv, sched)
            for a, b in zip(outs, base):
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{kv}/{sched}")


@pytest.mark.parametrize("name", ["plain-gqa", "mqa-interleaved", "sinks-window", "v-width"])
@pytest.mark.parametrize("backend", [("numpy", "float32"), ("torch", "float32"), ("torch", "bfloat16")])
@pytest.mark.parametrize("sched", ["decode", "mixed"])
def test_paged_equals_contiguous_bit_for_bit(name, backend, sched):
    be = Backend(backend[0], "cpu", backend[1])
    cfg, w, layer = _layer(name, be)
    if cfg.window is not None:  # eviction changes the kernel's row count; see the windowed test below
        layer = Layer.load(cfg.replace(window=None), w, be)
    xs = [RNG.normal(size=(10, 48)) for _ in range(3)]
    a, ta, _ = run_layer(layer, xs, "batched", sched)
    b, tb, _ = run_layer(layer, xs, "paged", sched, page_size=3)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    for x, y in zip(ta, tb):
        px, py = x.assemble(), y.assemble()
        assert all(np.array_equal(px[k], py[k]) for k in px)


def test_window_eviction_never_drops_a_row_still_read():
    cfg, w, layer = _layer("sliding-softcap-scale")
    x = [RNG.normal(size=(12, 48))]
    full, _, _ = run_layer(Layer.load(cfg, w, layer.backend), x, "decode", "prefill")
    dec, _, steps = run_layer(layer, x, "decode", "decode")
    np.testing.assert_allclose(dec[0], full[0], rtol=1e-12, atol=1e-12)
    # and it did evict: the cache holds only what the next query can see
    assert steps[0].cache.rows == cfg.window.size - 1
    _, _, steps = run_layer(_layer("chunked")[2], x, "decode", "decode")
    assert steps[0].cache.rows == 12 % 4  # the current chunk only


def test_paged_push_needs_reserved_pages():
    be = Backend("numpy", "cpu", "float64")
    pool = PagePool(be, 4, 2, (1, 2), (1, 2))
    seq = PagedSeq([])
    with pytest.raises(KvError, match="reserve pages"):
        pool.write(seq, np.zeros((1, 1, 2)), np.zeros((1, 1, 2)))
    pool.reserve(seq, 3)
    assert len(seq.block_table) == 2
    pool.write(seq, np.ones((3, 1, 2)), np.ones((3, 1, 2)))
    with pytest.raises(KvError, match="exhausted"):
        pool.reserve(seq, 10)


def test_contiguous_cache_tracks_positions_after_eviction():
    be = Backend("numpy", "cpu", "float64")
    c = ContiguousKv(be)
    c.push(np.zeros((5, 1, 2)), np.zeros((5, 1, 2)))
    assert c.evict_below(3) == 3 and list(c.positions) == [3, 4] and c.next_pos == 5
    assert Decode(c) != Paged(PagedSeq([]), None)


@pytest.mark.parametrize("name", ["plain-gqa", "obias-oscale-vscale-post", "output-gate-subnorm"])
def test_numpy_and_torch_agree(name):
    xs = [np.random.default_rng(5).normal(size=(9, 48))]
    res = {}
    for be in (Backend("numpy", "cpu", "float64"), Backend("torch", "cpu", "float64"),
               Backend("numpy", "cpu", "float32"), Backend("torch", "cpu", "float32")):
        _, _, layer = _layer(name, be)
        res[be.label()] = run_layer(layer, xs, "paged", "mixed")[0][0]
    np.testing.assert_allclose(res["torch-cpu-float64"], res["numpy-cpu-float64"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res["torch-cpu-float32"], res["numpy-cpu-float64"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res["numpy-cpu-float32"], res["numpy-cpu-float64"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_is_rounding_not_a_bug(dtype):
    xs = [np.random.default_rng(6).normal(size=(9, 48))]
    _, _, l64 = _layer("sinks-window")
    _, _, llo = _layer("sinks-window", Backend("torch", "cpu", dtype))
    a, b = run_layer(l64, xs, "decode", "mixed")[0][0], run_layer(llo, xs, "decode", "mixed")[0][0]
    nmse = ((a - b) ** 2).sum() / (a ** 2).sum()
    assert nmse < (1e-5 if dtype == "float16" else 1e-3)


def _gpu():
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_gpu() is None, reason="no cuda or mps device on this machine")
@pytest.mark.parametrize("name", ["plain-gqa", "sinks-window", "interleaved-gate"])
def test_gpu_matches_cpu(name):
    dev = _gpu()
    xs = [np.random.default_rng(7).normal(size=(9, 48))]
    _, _, lcpu = _layer(name, Backend("torch", "cpu", "float32"))
    _, _, lgpu = _layer(name, Backend("torch", dev, "float32"))
    for kv in ("decode", "paged"):
        a = run_layer(lcpu, xs, kv, "mixed")[0][0]
        b = run_layer(lgpu, xs, kv, "mixed")[0][0]
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
