"""The recurrent layer-kind plug-in (harness/kinds/recurrent): one plug-in under every
recurrent kind name, its features and memory dims, and the spec's own float64 formula
of the recurrence -- held to impl's body (float64, every schedule's rows) and to HF's
own modules, and shown to fail on a planted bug."""

from __future__ import annotations

import numpy as np
import pytest

from contract.recurrent import RECURRENT_KINDS
from harness import kinds
from harness.kinds.recurrent.spec import SUPPORTED, recurrent_layer
from harness.mutants import applied, registry
from test_recurrent_impl import F32_NMSE, KINDS, _x, impl_run, nmse

SPEC_KINDS = {"qwen3_next": "gated_delta_net", "qwen3_5": "gated_delta_net", "kimi_linear": "kimi_delta",
              "lfm2": "short_conv"}


def test_one_plugin_under_every_recurrent_kind():
    reg = kinds.registry()
    for k in RECURRENT_KINDS:
        assert k in reg and type(reg[k]).__name__ == "Recurrent" and reg[k].name == k


@pytest.mark.parametrize("name", list(SPEC_KINDS))
def test_features_and_dims(name):
    kind = KINDS[name]()
    plug = kinds.of(kind.cfg)
    f = plug.features(kind.cfg, kind.weights)
    assert SPEC_KINDS[name] in f and "causal_conv" in f and "recurrent_state" in f
    if name != "lfm2":
        assert {"qk_l2_norm", "beta_gate", "log_decay", "gated_out_norm"} <= f
    assert ("grouped_v_heads" in f) == (name.startswith("qwen3"))
    assert ("low_rank_gates" in f) == (name == "kimi_linear")
    # no KV rows and no scores; the probes and per-call states are counted instead
    assert plug.dims(kind.cfg)[1:] == (0, 0, 0, 0)
    assert plug.probe_elems(kind.cfg, 2, 70) > 2 * 70 * kind.cfg.conv_channels


@pytest.mark.parametrize("name", list(SPEC_KINDS))
def test_spec_formula_is_impl_in_float64_on_every_schedule(name):
    """impl (float64, NumPy) on a prefill, one row per call and mixed chunks, against the
    formula in one call: every probe the formula names, to float64 rounding."""
    kind = KINDS[name]()
    x = _x(11, 70)
    want = recurrent_layer(kind.cfg, kind.weights, x)
    for chunks in (None, [1] * 70, [3, 1, 2, 1, 40, 1, 22]):
        _, got, _ = impl_run(kind, x, chunks)
        for probe, b in want.items():
            a = got[probe]
            assert a.shape == b.shape, (probe, a.shape, b.shape)
            err = float(np.abs(a - b).max())
            assert err <= 1e-9 * max(1.0, float(np.abs(b).max())), (name, chunks, probe, err)


@pytest.mark.parametrize("name", list(SPEC_KINDS))
def test_spec_formula_is_hf(name):
    """The formula against HF's own module (no cache: its chunked scan; HF computes the
    scan, and the norms, in float32 inside a float64 module: the float32 bound)."""
    kind = KINDS[name]()
    x = _x(12, 70)
    want, normed, _ = kind.hf_run(x, None)
    w = dict(kind.weights)
    got = recurrent_layer(kind.cfg.replace(input_norm=type(kind.cfg.input_norm)("none")), w, normed)
    assert nmse(got["attn_out"], want) < F32_NMSE


# a bug per piece of the formula's dataflow, planted in impl: the comparison above fails
PLANTED = {"gated_delta_net": "recurrent-decay-sign", "kimi_delta": "recurrent-beta-not-squashed",
           "short_conv": "recurrent-conv-state-shifted"}


@pytest.mark.parametrize("name", ["qwen3_next", "kimi_linear", "lfm2"])
def test_spec_comparison_fails_on_a_planted_bug(name):
    kind = KINDS[name]()
    x = _x(13, 20)
    want = recurrent_layer(kind.cfg, kind.weights, x)
    with applied(registry()[PLANTED[kind.cfg.kind]]):
        _, got, _ = impl_run(kind, x, [5, 1, 14])
    errs = {p: float(np.abs(got[p] - want[p]).max()) for p in want if p in got}
    assert max(errs.values()) > 1e-3, errs


def test_spec_formula_says_what_it_does_not_cover():
    assert set(SUPPORTED) == {"gated_delta_net", "kimi_delta", "short_conv"}
    kind = KINDS["mamba2"]()
    with pytest.raises(NotImplementedError, match="no spec formula for a mamba2 layer"):
        recurrent_layer(kind.cfg, kind.weights, _x(0, 4))
