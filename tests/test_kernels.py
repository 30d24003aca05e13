"""impl against independent float64 formulas written here, and impl against itself
across schedules, KV backings and backends.

The formulas below are deliberately written the plain way (loops over heads and
queries, complex numbers for RoPE) so they share no code and no vectorisation
trick with impl's one body."""

from __future__ import annotations

import math

import numpy as np
import pytest

from impl import (Backend, softmax_scale, LayerConfig, NormSpec, QkNormSpec, TemperatureSpec, WindowSpec, alibi_slopes,
                  make_rope)
from impl.attention import Layer
from impl.config import ConfigError
from impl.kv import ContiguousKv, Decode, KvError, Paged, PagedSeq, PagePool
from impl.norms import normalize
from impl.rope import cos_sin, rotate
from impl.runner import run_layer
from impl.trace import LAYER_PROBES

from harness.kinds import spec_layer
from harness import specref
from harness.mutants import applied
from harness.kinds.attention.mutants.features4 import SPEC_MUTANTS
from harness.kinds.attention.mutants import features5
from harness.schedule import chunk_sizes

RNG = np.random.default_rng(1234)


# ----------------------------------------------------------------- formulas
# The spec's formulas live in harness/specref.py (the fuzzer's oracle too).
ref_rms, ref_layernorm, ref_rope, ref_attention, sig = (specref.rms, specref.layernorm, specref.rope,
                                                         specref.attention, specref.sig)


def ref_layer(cfg: LayerConfig, w: dict, x: np.ndarray):
    """``(branch, resid_mid)`` of the spec's layer (None, x for an absent one)."""
    if cfg.shape == "absent":
        return None, x
    p = spec_layer(cfg, w, x)
    return p["attn_out"], p.get("resid_mid")


# ----------------------------------------------------------------- configs
def weights_for(cfg: LayerConfig, *, biases=False, qk=False, sinks=False, gate=False, sub=False, obias=False,
                post=False, qk_bias=False, rng=RNG):
    hid, H, Hkv, D, Dv = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    s = 1 / math.sqrt(hid)
    qw = H * D * (2 if cfg.q_gate_interleaved else 1)
    w = {"attn_norm": 1 + 0.1 * rng.normal(size=hid), "wq": rng.normal(size=(qw, hid)) * s,
         "wk": rng.normal(size=(Hkv * D, hid)) * s, "wv": rng.normal(size=(Hkv * Dv, hid)) * s,
         "wo": rng.normal(size=(hid, H * Dv)) / math.sqrt(H * Dv)}
    if cfg.input_norm.kind == "layer":
        w["attn_norm_b"] = 0.1 * rng.normal(size=hid)
    if biases:  # Q's bias at the Q width (spec: after the gate split); the gate's own beside it
        w.update(bq=0.1 * rng.normal(size=H * D), bk=0.1 * rng.normal(size=Hkv * D), bv=0.1 * rng.normal(size=Hkv * Dv))
        if cfg.q_gate_interleaved:
            w["bq_gate"] = 0.1 * rng.normal(size=H * D)
    if qk:
        width = (((H, D), (Hkv, D)) if cfg.qk_norm.per_head else (D, D)) if cfg.qk_norm.over == "head" \
            else (H * D, Hkv * D)
        w.update(q_norm=1 + 0.1 * rng.normal(size=width[0]), k_norm=1 + 0.1 * rng.normal(size=width[1]))
        if qk_bias:
            w.update(q_norm_b=0.1 * rng.normal(size=width[0]), k_norm_b=0.1 * rng.normal(size=width[1]))
    if sinks:
        w["sinks"] = rng.normal(size=H)
    if gate:
        w["wg"] = rng.normal(size=(H if cfg.output_gate_per_head else H * Dv, hid)) * s
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
    "interleaved-gate": (LayerConfig(**BASE, rope=rope8(), q_gate_interleaved=True), {}),
    "interleaved-gate-bias": (LayerConfig(**BASE, rope=rope8(), q_gate_interleaved=True), {"biases": True}),
    "output-gate-subnorm": (LayerConfig(**BASE, rope=rope8(), output_gate=True, sub_norm=NormSpec("rms", 1e-5)),
                            {"gate": True, "sub": True}),
    "both-gates-subnorm": (LayerConfig(**BASE, rope=rope8(), q_gate_interleaved=True, output_gate=True,
                                       sub_norm=NormSpec("rms", 1e-5)), {"gate": True, "sub": True, "biases": True}),
    "obias-oscale-vscale-post": (LayerConfig(**BASE, rope=rope8(), o_scale=0.7, value_scale=1.3,
                                             post_norm=NormSpec("rms1p", 1e-6), residual_multiplier=0.5),
                                 {"obias": True, "post": True}),
    "v-width": (LayerConfig(**BASE, v_head_dim=12, rope=rope8()), {}),
    "parallel": (LayerConfig(**BASE, rope=rope8(), residual="parallel", input_norm=NormSpec("layer", 1e-5)), {}),
    # the L decorations (issue 26): LongRoPE's factor set and attention factor, llama4's
    # temperature without its offset (ministral3), QK norms with a weight (and a bias) per
    # head, the clamp after the QK norm (olmoe), V norm (gemma3n), a softplus gate per head
    "longrope-temp-no-offset": (LayerConfig(**BASE, rope=rope8(rot=6, kind="longrope", which="long",
                                                               short_factor=[1.0, 1.5, 2.0], long_factor=[2.0, 5.0, 9.0],
                                                               original_max_position_embeddings=16,
                                                               max_position_embeddings=64),
                                            temperature=TemperatureSpec(2.0, 0.3, offset=0)), {}),
    "qk-per-head-layernorm-bias": (LayerConfig(**BASE, rope=rope8(), input_norm=NormSpec("layer", 1e-5),
                                               qk_norm=QkNormSpec(NormSpec("layer", 1e-5), "head", per_head=True)),
                                   {"qk": True, "qk_bias": True}),
    "qk-norm-then-clamp-v-norm": (LayerConfig(**BASE, rope=rope8(), qkv_clamp=0.6, qkv_clamp_at="qk_norm",
                                              qk_norm=QkNormSpec(NormSpec("rms", 1e-6), "row"),
                                              v_norm=NormSpec("l2", 1e-6)), {"qk": True, "biases": True}),
    "softplus-gate-per-head": (LayerConfig(**BASE, rope=rope8(), output_gate=True, output_gate_fn="softplus",
                                           output_gate_per_head=True), {"gate": True}),
    "linear": (LayerConfig(hidden_size=48, shape="linear"), {}),
    "absent": (LayerConfig(hidden_size=48, shape="absent"), {}),
}


def _layer(name, backend=Backend("numpy", "cpu", "float64")):
    cfg, opts = CASES[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    w = weights_for(cfg, rng=rng, **opts) if cfg.shape == "gqa" else (
        {"attn_norm": 1 + 0.1 * rng.normal(size=48), "wo": rng.normal(size=(48, 48)) / 7} if cfg.shape == "linear" else {})
    return cfg, w, Layer.load(cfg, w, backend)


def _run(layer, xs, kv="decode", sched="prefill", **kw):
    """impl's runner with the case's schedule turned into chunk sizes (harness.schedule)."""
    return run_layer(layer, xs, kv, [chunk_sizes(sched, len(x)) for x in xs], **kw)


# ----------------------------------------------------------------- tests
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_plain_formula(name):
    cfg, w, layer = _layer(name)
    x = RNG.normal(size=(11, 48))
    outs, traces, _ = _run(layer, [x], "decode", "prefill")
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
    _, traces, _ = _run(layer, [x], "decode", "decode")
    got = traces[0].assemble()
    # recompute the formula's probabilities from impl's own q_rope / k_rope
    _, probs = ref_attention(got["q_rope"], got["k_rope"], got["v"], softmax_scale(cfg), window=cfg.window,
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


@pytest.mark.parametrize("name", ["plain-gqa", "sinks-window", "chunked", "interleaved-gate", "v-width", "alibi-6-heads",
                                  "longrope-temp-no-offset", "qk-per-head-layernorm-bias", "qk-norm-then-clamp-v-norm", "softplus-gate-per-head"])
@pytest.mark.parametrize("backend", [("numpy", "float64"), ("numpy", "float32"), ("torch", "float32")])
def test_prefill_equals_decode_in_every_kv_mode(name, backend):
    be = Backend(backend[0], "cpu", backend[1])
    cfg, w, layer = _layer(name, be)
    xs = [RNG.normal(size=(13, 48)) for _ in range(2)]
    base, _, _ = _run(layer, xs, "batched", "prefill")
    tol = 1e-12 if backend[1] == "float64" else 2e-5
    for kv in ("decode", "batched", "paged"):
        for sched in ("prefill", "decode", "mixed", "3,1,4,5"):
            outs, _, _ = _run(layer, xs, kv, sched)
            for a, b in zip(outs, base):
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{kv}/{sched}")


WINDOWED = ["sinks-window", "chunked", "sliding-softcap-scale"]


@pytest.mark.parametrize("name", ["plain-gqa", "mqa-interleaved", "v-width", "both-gates-subnorm"] + WINDOWED)
@pytest.mark.parametrize("backend", [("numpy", "float32"), ("torch", "float32"), ("torch", "bfloat16")])
@pytest.mark.parametrize("sched", ["decode", "mixed"])
def test_paged_equals_contiguous_bit_for_bit(name, backend, sched):
    """Spec push_and_attend_row: paging changes where rows live and nothing else --
    windowed layers included (sinks + window, chunked, sliding + softcap + scale),
    because window eviction is a KV option that is off unless asked for."""
    be = Backend(backend[0], "cpu", backend[1])
    cfg, w, layer = _layer(name, be)
    xs = [RNG.normal(size=(10, 48)) for _ in range(3)]
    a, ta, _ = _run(layer, xs, "batched", sched)
    b, tb, _ = _run(layer, xs, "paged", sched, page_size=3)
    for x, y in zip(a, b):
        assert np.array_equal(x, y), f"max |batched - paged| = {np.abs(x - y).max():.3g}"
    for x, y in zip(ta, tb):
        px, py = x.assemble(), y.assemble()
        assert all(np.array_equal(px[k], py[k]) for k in px)


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("backend,tol", [(("numpy", "float64"), 1e-13), (("numpy", "float32"), 2e-6),
                                         (("torch", "float32"), 2e-6)])
@pytest.mark.parametrize("kv", ["decode", "batched"])
def test_eviction_on_equals_eviction_off_within_rounding(name, backend, tol, kv):
    """spec evict_layer_kv drops only rows no later query reads: the same values
    within rounding (the kernel reduces over fewer, masked, rows), and it did evict."""
    be = Backend(backend[0], "cpu", backend[1])
    cfg, w, layer = _layer(name, be)
    xs = [RNG.normal(size=(13, 48)) for _ in range(1 if kv == "decode" else 2)]
    off, _, steps_off = _run(layer, xs, kv, "decode")
    on, _, steps_on = _run(layer, xs, kv, "decode", evict=True)
    for x, y in zip(off, on):
        np.testing.assert_allclose(y, x, rtol=tol, atol=tol)
    assert steps_off[0].cache.rows == 13 and steps_on[0].cache.rows < 13


def test_eviction_is_off_by_default_and_refused_on_paged():
    cfg, w, layer = _layer("sliding-softcap-scale")
    _, _, steps = _run(layer, [RNG.normal(size=(12, 48))], "decode", "decode")
    assert steps[0].cache.rows == 12  # every row kept: the spec's evict_layer_kv is a no-op unless on
    with pytest.raises(ConfigError, match="contiguous"):
        _run(layer, [RNG.normal(size=(4, 48))], "paged", "decode", evict=True)


def test_window_eviction_never_drops_a_row_still_read():
    cfg, w, layer = _layer("sliding-softcap-scale")
    x = [RNG.normal(size=(12, 48))]
    full, _, _ = _run(Layer.load(cfg, w, layer.backend), x, "decode", "prefill")
    dec, _, steps = _run(layer, x, "decode", "decode", evict=True)
    np.testing.assert_allclose(dec[0], full[0], rtol=1e-12, atol=1e-12)
    # and it did evict: the cache holds only what the next query can see
    assert steps[0].cache.rows == cfg.window.size - 1
    _, _, steps = _run(_layer("chunked")[2], x, "decode", "decode", evict=True)
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


@pytest.mark.parametrize("name", ["plain-gqa", "obias-oscale-vscale-post", "output-gate-subnorm",
                                  "longrope-temp-no-offset", "qk-per-head-layernorm-bias", "qk-norm-then-clamp-v-norm", "softplus-gate-per-head"])
def test_numpy_and_torch_agree(name):
    xs = [np.random.default_rng(5).normal(size=(9, 48))]
    res = {}
    for be in (Backend("numpy", "cpu", "float64"), Backend("torch", "cpu", "float64"),
               Backend("numpy", "cpu", "float32"), Backend("torch", "cpu", "float32")):
        _, _, layer = _layer(name, be)
        res[be.label()] = _run(layer, xs, "paged", "mixed")[0][0]
    np.testing.assert_allclose(res["torch-cpu-float64"], res["numpy-cpu-float64"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res["torch-cpu-float32"], res["numpy-cpu-float64"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res["numpy-cpu-float32"], res["numpy-cpu-float64"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_is_rounding_not_a_bug(dtype):
    xs = [np.random.default_rng(6).normal(size=(9, 48))]
    _, _, l64 = _layer("sinks-window")
    _, _, llo = _layer("sinks-window", Backend("torch", "cpu", dtype))
    a, b = _run(l64, xs, "decode", "mixed")[0][0], _run(llo, xs, "decode", "mixed")[0][0]
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
        a = _run(lcpu, xs, kv, "mixed")[0][0]
        b = _run(lgpu, xs, kv, "mixed")[0][0]
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------- the spec's shapes, refused before arithmetic
def test_linear_layer_is_wo_alone():
    """spec AttnShape::Linear => o_proj.apply(normed): no bias; a bias given is refused,
    not silently added."""
    cfg, w, layer = _layer("linear")
    x = RNG.normal(size=(5, 48))
    out, _, _ = _run(layer, [x], "decode", "prefill")
    want = specref.norm(x, cfg.input_norm, w["attn_norm"]) @ w["wo"].T
    np.testing.assert_allclose(out[0], want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ConfigError, match="weight 'bo' does not apply"):
        Layer.load(cfg, {**w, "bo": np.ones(48)}, layer.backend)


def test_q_bias_is_at_the_q_width_after_the_gate_split():
    """spec: split_interleaved_q_gate, THEN apply_qkv_bias_and_clamp at q_width =
    n_heads * head_dim; a double-width bias (one that would bias the gate) is refused."""
    cfg, w, layer = _layer("interleaved-gate-bias")
    assert w["bq"].shape == (6 * 8,)
    x = RNG.normal(size=(7, 48))
    out, traces, _ = _run(layer, [x], "decode", "mixed")
    want = spec_layer(cfg, w, x)
    np.testing.assert_allclose(traces[0].assemble()["q"], want["q"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[0], want["attn_out"], rtol=1e-10, atol=1e-10)
    # the gate's bias is its own: Q does not move when it changes, the branch does
    out2, traces2, _ = _run(Layer.load(cfg, {**w, "bq_gate": w["bq_gate"] + 1.0}, layer.backend), [x], "decode",
                            "mixed")
    assert np.array_equal(traces2[0].assemble()["q"], traces[0].assemble()["q"])
    assert not np.allclose(out2[0], out[0])
    with pytest.raises(ConfigError, match=r"weight bq has shape \(96,\), expected \(48,\)"):
        Layer.load(cfg, {**w, "bq": np.zeros(96)}, layer.backend)


def test_both_gates_apply_independently():
    """spec attn_branch_rows: the interleaved Q gate and the output gate are two
    Options, both applied when both are present."""
    cfg, w, layer = _layer("both-gates-subnorm")
    x = RNG.normal(size=(7, 48))
    _, traces, _ = _run(layer, [x], "decode", "decode")
    got = traces[0].assemble()
    want = spec_layer(cfg, w, x)
    np.testing.assert_allclose(got["attn_branch"], want["attn_branch"], rtol=1e-10, atol=1e-12)
    one = spec_layer(cfg.replace(output_gate=False), {k: v for k, v in w.items() if k != "wg"}, x)
    assert not np.allclose(got["attn_branch"], one["attn_branch"])  # the second gate acts


@pytest.mark.parametrize("name,shape", [("bk", (17,)), ("bv", (3,)), ("sinks", (5,)), ("q_norm", (9,)),
                                        ("k_norm", (16,)), ("sub_norm", (47,)), ("bo", (47,)),
                                        ("attn_norm", (47,)), ("bg", (3,))])
def test_every_weight_width_is_checked_before_arithmetic(name, shape):
    """One line naming the weight, its shape and the expected one (config.py's promise)."""
    cfg = LayerConfig(**BASE, rope=rope8(), output_gate=True, sub_norm=NormSpec("rms", 1e-5),
                      qk_norm=QkNormSpec(NormSpec("rms", 1e-6), "head"))
    w = weights_for(cfg, gate=True, sub=True, qk=True, sinks=True, biases=True, obias=True)
    Layer.load(cfg, w, Backend())  # the right widths load
    with pytest.raises(ConfigError, match=rf"^weight {name} has shape \({shape[0]},\), expected \(\d+,\)$"):
        Layer.load(cfg, {**w, name: np.zeros(shape)}, Backend())


def test_a_weight_of_a_switched_off_decoration_is_refused():
    cfg, w, _ = _layer("plain-gqa")
    for name, shape in (("q_norm", (8,)), ("sub_norm", (48,)), ("wg", (48, 48)), ("post_norm", (48,)),
                        ("bq_gate", (48,))):
        with pytest.raises(ConfigError, match=f"weight '{name}' does not apply"):
            Layer.load(cfg, {**w, name: np.zeros(shape)}, Backend())


def test_interleaved_gate_needs_v_as_wide_as_k():
    """spec apply_interleaved_gate multiplies a head_dim-wide gate onto the V-width head output."""
    with pytest.raises(ConfigError, match="v_head_dim=12.*valid: v_head_dim equal to head_dim"):
        LayerConfig(**BASE, v_head_dim=12, rope=rope8(), q_gate_interleaved=True)
    LayerConfig(**BASE, v_head_dim=12, rope=rope8(), output_gate=True)  # the output gate is V-wide: fine


@pytest.mark.parametrize("mutant", features5.SPEC_MUTANTS, ids=lambda m: m.name)
def test_l_decoration_mutants_are_caught_by_the_spec_formula(mutant):
    """Decorations of issue 26 whose reference family is not here (olmoe's clamp after
    the QK norm, gemma3n's V norm): the spec's formula judges them on their kernel
    case, and each break is caught at the probe where it first acts."""
    cfg, w, layer = _layer(features5.SPEC_CASES[mutant.name])
    x = RNG.normal(size=(7, 48)) * 3  # wide enough that the clamp at 0.6 acts on q, k and v

    def first_failure():
        got = _run(Layer.load(cfg, w, layer.backend), [x], "decode", "mixed")[1][0].assemble()
        return next((p for p in LAYER_PROBES if p in got and p in want
                     and not np.allclose(got[p], want[p], rtol=1e-10, atol=1e-12)), None)

    want = spec_layer(cfg, w, x)
    assert first_failure() is None
    with applied(mutant):
        assert first_failure() == mutant.first_probe


@pytest.mark.parametrize("mutant", SPEC_MUTANTS, ids=lambda m: m.name)
def test_gate_order_mutants_are_caught_by_the_spec_formula(mutant):
    """A layer with both gates and a sub-norm exists in no reference family: the spec's
    formula judges it, and a break of the order is caught at its probe."""
    cfg, w, layer = _layer("both-gates-subnorm")
    x = RNG.normal(size=(7, 48))
    want = spec_layer(cfg, w, x)

    def first_failure():
        got = _run(Layer.load(cfg, w, layer.backend), [x], "decode", "mixed")[1][0].assemble()
        return next((p for p in LAYER_PROBES if p in got and p in want
                     and not np.allclose(got[p], want[p], rtol=1e-10, atol=1e-12)), None)

    assert first_failure() is None
    with applied(mutant):
        assert first_failure() == mutant.first_probe
