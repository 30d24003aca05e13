"""deepseek_v3 specifics: HF's de-interleaved rope slice brought to the canonical
(interleaved) order, the naive form in every KV mode, rope_interleave=False
(HF's rotate-half of the rope slice, not the spec's MLA) refused."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import bad_rows, run
from harness.families import get
from harness.families._mla import reinterleave

FAMILY = "deepseek_v3"


def test_reinterleave_undoes_hf_apply_rotary_pos_emb_interleave():
    """HF returns cat(x[0::2], x[1::2]) of the rotated pairs; the canonical order is
    the pairs in place (ggml NORM)."""
    rng = np.random.default_rng(0)
    canon = rng.standard_normal((2, 5, 4, 20))
    nope = 12
    hf = np.concatenate([canon[..., :nope], canon[..., nope::2], canon[..., nope + 1::2]], axis=-1)
    np.testing.assert_array_equal(reinterleave(hf, nope), canon)
    fam = get(FAMILY)
    lc = fam.layer_configs(fam.make_config({}))[0]
    eager = hf.transpose(0, 2, 1, 3)  # [S, H, T, D] as the eager function sees it
    np.testing.assert_array_equal(fam.hf_canonical("q_rope", eager, lc), canon)


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_naive_form_meets_both_references(policy, need_llamacpp, kv):
    rows = run(policy, family=FAMILY, ref="all", kv=kv, variant="naive")
    assert not bad_rows(rows)
    assert {(r["layer"], r["probe"]) for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp"
            and r["status"] == "pass"} >= {(0, "q_rope"), (0, "k_rope"), (0, "k_pe"), (2, "attn_probs")}


def test_rope_interleave_false_is_refused(policy):
    """HF-only rotate-half on the raw slice is not the spec's MLA (rotate_pe:
    apply_rope_interleaved only): impl refuses the layout, so the case is bad input,
    one line, before anything runs."""
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="interleaved pairs.*'neox'"):
        run(policy, family=FAMILY, ref="hf", overrides=(("rope_interleave", False),))
