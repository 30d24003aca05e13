"""Low-precision arithmetic bugs (issue 28) are caught where a real model would
show them -- a trained model's magnitudes (--weights realistic) and lengths of
256 tokens -- and not excused as rounding: the float16 softmax without max
subtraction, and attn @ V summed key by key in the input dtype. Each check also
shows the case that could NOT see the bug (O(1) weights, 24 tokens), so the
realistic and long cases are what the matrix needs them for."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import applied, registry
from harness.pytest_fixtures import run

MUTANTS = registry()


def _impl_bad(rows, ref="hf"):
    return [r for r in rows if r["candidate"] == "impl" and r["reference"] == ref and r["status"] in ("fail", "error")]


def _run(policy, mutant=None, **kw):
    if mutant is None:
        return run(policy, **kw)
    with applied(MUTANTS[mutant]), np.errstate(all="ignore"):
        return run(policy, **kw)


F16 = dict(family="llama", backend="torch", dtype="float16", kv="paged", tokens=24, ref="hf")


def test_float16_softmax_without_max_overflows_on_realistic_weights(policy):
    m = "softmax-low-precision-no-max"
    assert not _impl_bad(_run(policy, **F16, weights="realistic"))
    bad = _impl_bad(_run(policy, m, **F16, weights="realistic"))
    assert bad and any("non-finite" in r["reason"] for r in bad)
    # the cases that cannot see it: O(1) scores never reach float16's exp overflow, and
    # bfloat16 has float32's range
    assert not _impl_bad(_run(policy, m, **F16))
    assert not _impl_bad(_run(policy, m, **{**F16, "dtype": "bfloat16"}, weights="realistic"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_attn_v_summed_in_the_input_dtype_fails_at_256_tokens(policy, dtype):
    m = "attn-v-accumulated-in-input-dtype"
    kw = dict(family="llama", backend="torch", dtype=dtype, kv="paged", weights="realistic", ref="hf")
    long = dict(kw, tokens=256, schedule="prefill")
    assert not _impl_bad(_run(policy, **long))
    bad = _impl_bad(_run(policy, m, **long))
    assert bad and min(r["layer"] for r in bad) == 0
    worst = max(bad, key=lambda r: r["err_ratio"])
    # judged by the oracle rule: impl's distance to HF's float64 run over HF's own
    assert worst["nmse_cand_oracle"] > 4 * worst["nmse_ref_oracle"]
    # at 24 tokens the same bug is inside the rounding
    assert not _impl_bad(_run(policy, m, **kw, tokens=24))
