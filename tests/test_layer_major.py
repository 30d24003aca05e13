"""HF's cached path layer by layer (harness/references/hf/layer_major.py) is the
call-by-call path, bit for bit, for every family that declares it; and where a
cache read shows the order cannot hold, the capture falls back to call by call."""

from __future__ import annotations

import numpy as np
import pytest

from harness import families


def _layer_major_families() -> list[str]:
    return sorted(n for n, f in families.registry().items() if getattr(f, "layer_major", False))


def _captures(family: str, overrides=()):
    """(call by call, layer by layer) of HF's cached path, float32 free-running and
    the float64 oracle teacher-forced on it, on a tiny model."""
    from harness.case import Case, CaseRun
    from harness.references.hf import capture as hf
    from harness.references.hf import layer_major

    r = CaseRun(Case(family=family, tokens=9, overrides=overrides), None)
    fam, cfg, lcs, toks, model = r.family, r.config, r.layer_cfgs, r.tokens, r.base_model
    calls = [3, 1, 2, 1, 1, 1]
    out, ran = [], []
    real_applies, real_run = layer_major.applies, layer_major.LayerMajor.run

    def run(self, fn):
        res = real_run(self, fn)
        ran.append(self.first_group)  # the layer-by-layer order ran to the end
        return res

    layer_major.LayerMajor.run = run
    try:
        for by_layer in (False, True):
            layer_major.applies = real_applies if by_layer else (lambda *a: False)
            free = hf.capture(fam, model, cfg, lcs, toks, calls=calls)
            forced = {k: v for k, v in free.items() if k.endswith(".layer_in")}
            oracle = hf.capture(fam, model, cfg, lcs, toks, calls=calls, force_inputs=forced, float64=True,
                                model_probes=False)
            out.append((free, oracle))
    finally:
        layer_major.applies, layer_major.LayerMajor.run = real_applies, real_run
    return out, ran


@pytest.mark.parametrize("family", _layer_major_families())
def test_layer_major_is_call_by_call_bit_for_bit(family):
    ((free_a, orc_a), (free_b, orc_b)), ran = _captures(family)
    assert len(ran) == 2  # both captures ran layer by layer (no fallback)
    for a, b in ((free_a, free_b), (orc_a, orc_b)):
        assert a and set(a) == set(b)
        bad = [k for k in a if not (a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]))]
        assert not bad, bad[:4]
    assert "logits" in free_a and "L1.attn_probs" in free_a
