"""deepseek_v3 specifics: HF's de-interleaved rope slice brought to the canonical
(interleaved) order, the naive form in every KV mode, rope_interleave=False
(HF's rotate-half of the rope slice, not the spec's MLA) refused."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, bad_rows
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
def test_naive_form_meets_both_references(run, policy, need_llamacpp, kv):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv=kv, variant="naive")
    assert not bad_rows(rows)
    assert {(r["layer"], r["probe"]) for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp"
            and r["status"] == "pass"} >= {(0, "q_rope"), (0, "k_rope"), (0, "k_pe"), (2, "attn_probs")}


def test_rope_interleave_false_meets_hf_and_is_refused_for_llamacpp(run, policy):
    """rotate-half on the raw slice (rope_interleave=false): impl's MLA takes that
    layout (minicpm3's), so impl meets HF at q_rope; llama.cpp's deepseek2 always
    rotates interleaved pairs on an unpermuted file, another model, so a case
    against it is bad input, one line, before anything runs (the CLI's exit 2:
    tests/test_cli.py BAD)."""
    rows = run(policy, family=FAMILY, ref="hf", overrides=(("rope_interleave", False),))
    assert not bad_rows(rows)
    assert any(r["probe"] == "q_rope" and r["status"] == "pass" for r in rows)
    fam = get(FAMILY)
    why = fam.lc_refusal(fam.make_config({"rope_interleave": False}))
    assert why and "interleaved pairs" in why and "--ref hf" in why
    assert fam.hf_refusal(fam.make_config({"rope_interleave": False})) is None
    assert fam.lc_refusal(fam.make_config({})) is None
