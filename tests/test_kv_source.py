"""KV shared across layers (``LayerConfig.kv_source``): a layer that attends over an
earlier layer's cached K/V instead of projecting its own (HF
``Gemma3nTextAttention.is_kv_shared_layer`` / ``shared_kv_states``; llama.cpp gemma3n.cpp
``!hparams.has_kv(il)``, the cache layer llama-model.cpp's ``reuse`` names).

impl's reader is judged against the spec's own float64 formula (harness/kinds/attention/
spec.py) fed the SOURCE's cached rows, in every KV backing, on prefill / decode / mixed
schedules and a ragged, continuously batched one (a paged sequence that leaves gives its
pages back while another is still to join); each planted bug (``KV_SOURCE_MUTANTS``) fails
at its probe. Tiny layers, float64: a second or two."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contract.errors import ConfigError as ContractError
from harness.kinds.attention.mutants.features5 import KV_SOURCE_MUTANTS
from harness.kinds.attention.spec import attn_layer
from harness.mutants import applied
from impl import Backend, LayerConfig, NormSpec, QkNormSpec, WindowSpec, make_rope
from impl.attention import Layer
from impl.config import ConfigError
from impl.runner import run_layer

BE = Backend("numpy", "cpu", "float64")
HID, H, HKV, D = 32, 2, 1, 16


def _cfg(**kw) -> LayerConfig:
    # gemma3n's attention half: a (1 + w)-free RMS QK norm per head before RoPE, V normed
    # without a weight, softmax scale 1 (HF Gemma3nTextAttention: scaling = 1.0)
    return LayerConfig(hidden_size=HID, n_heads=H, n_kv_heads=HKV, head_dim=D,
                       input_norm=NormSpec("rms", 1e-6), qk_norm=QkNormSpec(NormSpec("rms", 1e-6)),
                       v_norm=NormSpec("rms", 1e-6), rope=make_rope("default", 10000.0, D, "neox", {}),
                       scale=1.0, post_norm=NormSpec("rms", 1e-6), **kw)


def _weights(rng, shared: bool) -> dict:
    s = 1 / math.sqrt(HID)
    w = {"attn_norm": 1 + 0.1 * rng.normal(size=HID), "wq": rng.normal(size=(H * D, HID)) * s,
         "q_norm": 1 + 0.1 * rng.normal(size=D), "wo": rng.normal(size=(HID, H * D)) / math.sqrt(H * D),
         "post_norm": 1 + 0.1 * rng.normal(size=HID)}
    if not shared:
        w.update(wk=rng.normal(size=(HKV * D, HID)) * s, wv=rng.normal(size=(HKV * D, HID)) * s,
                 k_norm=1 + 0.1 * rng.normal(size=D))
    return w


def _pair(window=None, seed=0):
    rng = np.random.default_rng(seed)
    src_cfg, rd_cfg = _cfg(window=window), _cfg(window=window, kv_source=0)
    return (src_cfg, _weights(rng, False)), (rd_cfg, _weights(rng, True))


# (kv mode, per-sequence lengths, per-sequence chunks, arrivals)
PLANS = {
    "decode-prefill": ("decode", [9, 9], [[9], [9]], None),
    "decode-mixed": ("decode", [9, 9], [[4, 1, 1, 1, 1, 1], [4, 1, 1, 1, 1, 1]], None),
    "batched-decode": ("batched", [7, 7], [[1] * 7, [1] * 7], None),
    "paged-mixed": ("paged", [9, 9], [[4, 1, 1, 1, 1, 1], [4, 1, 1, 1, 1, 1]], None),
    # ragged continuous batching: sequence 0 leaves (its pages go back to the pool) while
    # sequence 2 is still to join -- the source's pages, which the reader reads through
    "paged-ragged": ("paged", [5, 8, 6], [[3, 1, 1], [2, 2, 1, 1, 1, 1], [4, 1, 1]], [0, 0, 4]),
    "batched-ragged": ("batched", [5, 8, 6], [[3, 1, 1], [2, 2, 1, 1, 1, 1], [4, 1, 1]], [0, 0, 4]),
}


def _worst(plan: str, window=None) -> tuple[str | None, float]:
    """The first probe (in dataflow order) where impl's reader leaves the spec's formula,
    and the largest NMSE over every probe and sequence."""
    (sc, sw), (rc, rw) = _pair(window)
    kv, lengths, chunks, arrivals = PLANS[plan]
    rng = np.random.default_rng(7)
    xs_src = [rng.normal(size=(n, HID)) for n in lengths]
    xs = [rng.normal(size=(n, HID)) for n in lengths]
    _, traces, _ = run_layer(Layer.load(rc, rw, BE), xs, kv, chunks, page_size=2, arrivals=arrivals,
                             source=(Layer.load(sc, sw, BE), xs_src))
    first, worst = None, 0.0
    for s in range(len(xs)):
        _, cache = attn_layer(sc, sw, xs_src[s], want_kv=True)
        want = attn_layer(rc, rw, xs[s], kv=cache)
        got = traces[s].assemble()
        assert set(got) == {"layer_in", *rc.expected_probes()}, sorted(got)
        for p in ("layer_in", *rc.expected_probes()):
            if got[p].shape != want[p].shape:  # a grid of the wrong size fails as a mismatch
                nmse = math.inf
            else:
                nmse = float(np.sum((got[p] - want[p]) ** 2) / max(np.sum(want[p] ** 2), 1e-300))
            worst = max(worst, nmse)
            if nmse > 1e-24 and (first is None or _order(p) < _order(first)):
                first = p
    return first, worst


def _order(p: str) -> int:
    return ("layer_in", *_cfg(kv_source=0).expected_probes()).index(p)


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_reader_attends_over_the_source_cache_in_every_backing(plan):
    first, worst = _worst(plan, window=WindowSpec("sliding", 3) if "ragged" in plan else None)
    assert first is None and worst < 1e-24, (first, worst)


def test_reader_emits_no_k_v_of_its_own_and_keeps_no_rows():
    rd = _cfg(kv_source=3)
    assert {"k", "v", "k_rope"}.isdisjoint(rd.expected_probes())
    assert {"q", "q_rope", "attn_probs", "attn_out", "resid_mid"} <= set(rd.expected_probes())
    (_, _), (rc, rw) = _pair()
    assert not Layer.load(rc, rw, BE).has_kv()


@pytest.mark.parametrize("mutant", KV_SOURCE_MUTANTS, ids=lambda m: m.name)
def test_kv_sharing_mutants_fail_at_their_probe(mutant):
    """Each planted bug is caught by the same check that passes above, at its probe."""
    assert _worst("paged-mixed")[0] is None
    with applied(mutant):
        for plan in ("decode-mixed", "paged-mixed", "batched-ragged"):
            assert _worst(plan)[0] == mutant.first_probe, plan


def test_kv_source_refusals():
    (sc, sw), (rc, rw) = _pair()
    x = [np.zeros((3, HID))]
    src = (Layer.load(sc, sw, BE), x)
    for bad in (-1, True, 1.5):
        with pytest.raises(ContractError, match="kv_source=.*valid: an integer >= 0"):
            _cfg(kv_source=bad)
    with pytest.raises(ContractError, match="a linear layer reads none"):
        LayerConfig(hidden_size=HID, shape="linear", kv_source=0)
    with pytest.raises(ConfigError, match="weight 'wk' does not apply.*kv_source=0"):
        Layer.load(rc, {**rw, "wk": sw["wk"]}, BE)
    with pytest.raises(ConfigError, match="no source layer was given"):
        run_layer(Layer.load(rc, rw, BE), x)
    with pytest.raises(ConfigError, match="projects its own K/V"):
        run_layer(Layer.load(sc, sw, BE), x, source=src)
    with pytest.raises(ConfigError, match="must keep K/V rows of its own"):
        run_layer(Layer.load(rc, rw, BE), x, source=(Layer.load(rc, rw, BE), x))
    with pytest.raises(ConfigError, match="the same sequences"):
        run_layer(Layer.load(rc, rw, BE), x, source=(src[0], [np.zeros((4, HID))]))
    with pytest.raises(ConfigError, match="KV eviction"):
        run_layer(Layer.load(rc, rw, BE), x, evict=True, source=src)
    wide = LayerConfig(**{**_cfg().__dict__, "n_kv_heads": 2})
    rng = np.random.default_rng(1)
    ww = {**_weights(rng, False), "wk": rng.normal(size=(2 * D, HID)), "wv": rng.normal(size=(2 * D, HID))}
    with pytest.raises(ConfigError, match="K/V rows are"):
        run_layer(Layer.load(rc, rw, BE), x, source=(Layer.load(wide, ww, BE), x))


def test_torch_backend_reader_matches_numpy():
    """The one body over torch: the reader and its source on torch's CPU float64 give
    NumPy's result (the sharing is no NumPy-only path)."""
    pytest.importorskip("torch")
    (sc, sw), (rc, rw) = _pair(WindowSpec("sliding", 3))
    rng = np.random.default_rng(3)
    xs_src, xs = [rng.normal(size=(6, HID))], [rng.normal(size=(6, HID))]
    got = {}
    for name in ("numpy", "torch"):
        be = Backend(name, "cpu", "float64")
        _, traces, _ = run_layer(Layer.load(rc, rw, be), xs, "paged", [[3, 1, 2]], page_size=2,
                                 source=(Layer.load(sc, sw, be), xs_src))
        got[name] = traces[0].assemble()
    for p, a in got["numpy"].items():
        np.testing.assert_allclose(got["torch"][p], a, rtol=1e-12, atol=1e-13, err_msg=p)


def test_impl_candidate_runs_the_source_its_layer_call_names():
    """The candidate path: a LayerCall of a kv_source layer carries the source's LayerCall
    (contract.candidate.LayerCall.source); impl's candidate attends over the source's cache,
    and without the source it refuses the layer in one line."""
    from contract.candidate import LayerCall
    from harness.candidates import get

    (sc, sw), (rc, rw) = _pair()
    rng = np.random.default_rng(5)
    xs_src, xs = [rng.normal(size=(5, HID))], [rng.normal(size=(5, HID))]

    def call(j, cfg, w, inputs, source=None):
        return LayerCall(j, cfg, w, inputs, "paged", (2, 1, 1, 1), 2, 0, False, "numpy", "cpu", "float64",
                         "test", source=source)

    got = get("impl").run_layer(call(3, rc, rw, xs, source=call(1, sc, sw, xs_src)))
    _, cache = attn_layer(sc, sw, xs_src[0], want_kv=True)
    want = attn_layer(rc, rw, xs[0], kv=cache)
    for p in rc.expected_probes():
        np.testing.assert_allclose(got[p][0], want[p], rtol=1e-10, atol=1e-12, err_msg=p)
    with pytest.raises(ConfigError, match="no source layer was given"):
        get("impl").run_layer(call(3, rc, rw, xs))


def test_source_products_are_rounded_as_the_readers_against_quantized_llamacpp():
    """Against llama.cpp on quantized weights the source's K/V products round their
    activations as ggml does (its LayerCall's ggml_act), as the reader's own do: the
    reader's rows then differ from the unrounded source's, and the layer counts as met."""
    from contract.candidate import LayerCall
    from harness.candidates import get

    (sc, sw), (rc, rw) = _pair()
    rng = np.random.default_rng(9)
    xs_src, xs = [rng.normal(size=(5, HID))], [rng.normal(size=(5, HID))]
    q8 = {n: "q8_0" for n in ("wq", "wk", "wv", "wo")}

    def call(j, cfg, w, inputs, act, source=None):
        return LayerCall(j, cfg, w, inputs, "decode", (5,), 2, 0, False, "numpy", "cpu", "float32", "llama",
                         ggml_act={k: v for k, v in act.items() if k in w}, source=source)

    runs = {}
    for name, src_act in (("plain", {}), ("rounded", q8)):
        c = call(3, rc, rw, xs, q8, source=call(1, sc, sw, xs_src, src_act))
        runs[name] = (get("impl").run_layer(c), c.ggml_met)
    assert runs["rounded"][1] == {"wq", "wo"}
    assert not np.array_equal(runs["plain"][0]["attn_probs"], runs["rounded"][0]["attn_probs"])
    assert np.array_equal(runs["plain"][0]["q_rope"], runs["rounded"][0]["q_rope"])  # the reader's own Q: the same


def test_a_candidate_that_reads_no_source_is_skipped_saying_so():
    """A teacher-forced candidate without ``reads_kv_source`` is never handed a kv_source
    layer: ``CaseRun._rows`` makes the case one skipped row with this reason, before any
    capture (impl and impl's torch-sdpa-kernel read the source)."""
    from harness.candidates import get
    from harness.candidates.api import LayerCandidate, kv_source_limit

    class NoSource(LayerCandidate):  # an engine written before kv_source
        name = "no-source"

        def run_layer(self, call):
            raise AssertionError("must not be handed a layer")

    (sc, _), (rc, _) = _pair()
    assert kv_source_limit(NoSource(), [sc, sc]) is None
    why = kv_source_limit(NoSource(), [sc, rc])
    assert "no-source does not run a layer that reads another layer's K/V (layers [1]" in why
    for name in ("impl", "torch-sdpa-kernel"):
        assert kv_source_limit(get(name), [sc, rc]) is None
