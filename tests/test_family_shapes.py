"""Per-layer attention shapes on a synthetic stack (no reference family has them):
per-layer head counts, a layer with no attention (spec ``AttnShape::Absent``,
deci.cpp) and a layer whose attention is one linear map (``AttnShape::Linear``).

The stack runs through ``impl.runner`` layer after layer -- each layer's output
residual is the next layer's input -- in every KV mode and schedule, on NumPy
and torch, and is checked against a plain float64 formula written here (loops
over heads and queries, complex-number RoPE), which shares no code with impl.
Deliberate bugs (mutants) in the shape handling must make the check fail."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import Mutant, applied, registry
from impl import Backend, LayerConfig, NormSpec, WindowSpec, make_rope
from harness.schedule import chunk_sizes
from impl.runner import load_layer, run_layer

HIDDEN = 32
EPS = 1e-6
# (shape, n_heads, n_kv_heads, head_dim, window, rope theta or None for NoPE)
STACK = [
    ("gqa", 4, 2, 8, None, 10000.0),
    ("absent", 0, 0, 0, None, None),
    ("gqa", 2, 1, 12, 3, 500.0),  # a narrower layer, MQA, windowed, its own theta
    ("linear", 0, 0, 0, None, None),
    ("gqa", 8, 8, 4, None, None),  # a wider NoPE layer, plain MHA
]


def build_stack(seed: int = 0):
    rng = np.random.default_rng(seed)
    cfgs, weights = [], []
    for shape, h, hkv, d, window, theta in STACK:
        w = {"attn_norm": 1.0 + 0.1 * rng.standard_normal(HIDDEN)}
        if shape == "absent":
            cfgs.append(LayerConfig(hidden_size=HIDDEN, shape="absent"))
            weights.append({})
            continue
        if shape == "linear":
            cfgs.append(LayerConfig(hidden_size=HIDDEN, shape="linear", input_norm=NormSpec("rms", EPS)))
            w["wo"] = rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)
            weights.append(w)
            continue
        cfgs.append(LayerConfig(
            hidden_size=HIDDEN, n_heads=h, n_kv_heads=hkv, head_dim=d, input_norm=NormSpec("rms", EPS),
            rope=None if theta is None else make_rope("default", theta, d),
            window=None if window is None else WindowSpec("sliding", window)))
        for name, rows, cols in (("wq", h * d, HIDDEN), ("wk", hkv * d, HIDDEN), ("wv", hkv * d, HIDDEN),
                                 ("wo", HIDDEN, h * d)):
            w[name] = rng.standard_normal((rows, cols)) / np.sqrt(cols)
        weights.append(w)
    return cfgs, weights


# ----------------------------------------------------------------- the plain formula
def plain_rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def plain_rope(x, theta):
    """x[n, heads, d] at positions 0..n-1, neox halves, by complex multiplication."""
    n, _, d = x.shape
    out = x.copy()
    for t in range(n):
        for i in range(d // 2):
            z = np.exp(1j * t * theta ** (-2.0 * i / d))
            c = (x[t, :, i] + 1j * x[t, :, i + d // 2]) * z
            out[t, :, i], out[t, :, i + d // 2] = c.real, c.imag
    return out


def plain_layer(x, shape, h, hkv, d, window, theta, w):
    """The branch one layer adds to the residual (None: no attention branch)."""
    if shape == "absent":
        return None
    normed = plain_rms(x, w["attn_norm"])
    if shape == "linear":
        return normed @ w["wo"].T
    n = x.shape[0]
    q = (normed @ w["wq"].T).reshape(n, h, d)
    k = (normed @ w["wk"].T).reshape(n, hkv, d)
    v = (normed @ w["wv"].T).reshape(n, hkv, d)
    if theta is not None:
        q, k = plain_rope(q, theta), plain_rope(k, theta)
    heads = np.zeros((n, h, d))
    for hh in range(h):
        g = hh // (h // hkv)
        for t in range(n):
            lo = 0 if window is None else max(0, t - window + 1)
            s = np.array([q[t, hh] @ k[j, g] for j in range(lo, t + 1)]) / np.sqrt(d)
            p = np.exp(s - s.max())
            p /= p.sum()
            heads[t, hh] = sum(p[j - lo] * v[j, g] for j in range(lo, t + 1))
    return heads.reshape(n, h * d) @ w["wo"].T


def plain_stack(x, weights):
    branches = []
    for (shape, h, hkv, d, window, theta), w in zip(STACK, weights):
        b = plain_layer(x, shape, h, hkv, d, window, theta, w)
        branches.append(b)
        x = x if b is None else x + b
    return x, branches


# ----------------------------------------------------------------- impl, layer after layer
def impl_stack(inputs, cfgs, weights, backend, kv_mode, schedule):
    xs = [np.asarray(x) for x in inputs]
    branches = []
    for cfg, w in zip(cfgs, weights):
        layer = load_layer(cfg, w, backend)
        outs, _, _ = run_layer(layer, xs, kv_mode, [chunk_sizes(schedule, len(x)) for x in xs], page_size=2,
                               trace=False)
        branches.append(outs)
        xs = [x if o is None else x + o for x, o in zip(xs, outs)]
    return xs, branches


def check_stack(backend_name="numpy", kv_mode="decode", schedule="mixed", lengths=(9,)):
    cfgs, weights = build_stack()
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((t, HIDDEN)) for t in lengths]
    be = Backend(backend_name, "cpu", "float64")
    got, got_branches = impl_stack(inputs, cfgs, weights, be, kv_mode, schedule)
    for s, x in enumerate(inputs):
        want, want_branches = plain_stack(x, weights)
        for i, (gb, wb) in enumerate(zip(got_branches, want_branches)):
            if wb is None:
                assert gb[s] is None, f"layer {i} has no attention: its branch must be None, not an array"
            else:
                assert gb[s] is not None and gb[s].shape == wb.shape, f"layer {i}"
                np.testing.assert_allclose(gb[s], wb, rtol=0, atol=1e-10, err_msg=f"layer {i} branch, seq {s}")
        np.testing.assert_allclose(got[s], want, rtol=0, atol=1e-10, err_msg=f"stack output, seq {s}")


def test_the_stack_has_what_it_claims():
    from harness.features import model_features

    cfgs, weights = build_stack()
    f = model_features(cfgs, weights)
    assert {"per_layer_heads", "absent_layer", "linear_layer", "nope_layers", "per_layer_theta", "gqa",
            "mqa", "sliding_window"} <= f


@pytest.mark.parametrize("schedule", ["prefill", "decode", "mixed", "4,3,2"])
@pytest.mark.parametrize("kv_mode", ["decode", "batched", "paged"])
def test_stack_matches_plain_formula(kv_mode, schedule):
    lengths = (9,) if kv_mode == "decode" else (9, 6)
    if schedule == "4,3,2":
        lengths = (9,) if kv_mode == "decode" else (9, 9)
    check_stack("numpy", kv_mode, schedule, lengths)


@pytest.mark.parametrize("kv_mode", ["decode", "paged"])
def test_stack_on_torch(kv_mode):
    pytest.importorskip("torch")
    check_stack("torch", kv_mode, "mixed", (9,) if kv_mode == "decode" else (9, 6))


# ----------------------------------------------------------------- broken on purpose
SHAPE_MUTANTS = [
    Mutant("linear-layer-skips-its-norm", "linear_layer", "impl.attention",
           'branch = _linear(xp, normed, w["wo"], None)', 'branch = _linear(xp, x, w["wo"], None)',
           doc="the linear layer projects the raw residual instead of the normed row"),
    Mutant("absent-layer-runs-attention", "absent_layer", "impl.attention",
           'if cfg.shape == "absent":\n        # deci.cpp', 'if cfg.shape == "absent_":\n        # deci.cpp',
           doc="an absent layer is run as an attention layer"),
    Mutant("absent-layer-returns-a-zero-branch", "absent_layer", "impl.attention",
           'put("resid_mid", x)\n        return None, x', 'put("resid_mid", x)\n        return x * 0, x',
           doc="an absent layer returns an all-zero branch instead of none"),
    Mutant("kv-rows-sized-by-head-dim-only", "per_layer_heads", "impl.attention",
           "return (self.cfg.n_kv_heads, self.cfg.head_dim), (self.cfg.n_kv_heads, self.cfg.dv)",
           "return (1, self.cfg.n_kv_heads * self.cfg.head_dim), (1, self.cfg.n_kv_heads * self.cfg.dv)",
           doc="paged KV rows laid out as one flat head"),
]


@pytest.mark.parametrize("m", SHAPE_MUTANTS + [registry()["gqa-head-map"]], ids=lambda m: m.name)
def test_shape_mutants_are_caught(m):
    check_stack("numpy", "paged", "mixed", (9, 6))  # clean first: the check can pass
    with applied(m):
        with pytest.raises(Exception):
            check_stack("numpy", "paged", "mixed", (9, 6))
