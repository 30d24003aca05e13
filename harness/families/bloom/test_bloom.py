"""bloom: ALiBi (power-of-two and 6 heads), the fused per-head interleaved QKV
and the converter's reorder, probes read without an eager function."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_fails_first_at_q

SIX_HEADS = (("hidden_size", 96), ("n_head", 6))


@pytest.mark.parametrize("n", list(range(1, 17)) + [20, 24, 40])
def test_alibi_slopes_equal_both_hf_rules(n):
    """impl's slopes (llama.cpp's soft_max rule) = HF bloom's _get_alibi_slopes and
    HF mpt's build_mpt_alibi_tensor (max bias 8), power of two or not."""
    import torch
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from impl.config import alibi_slopes

    ours = np.asarray(alibi_slopes(n, 8.0))
    np.testing.assert_allclose(ours, _get_alibi_slopes(n, torch.device("cpu")).double().numpy(), rtol=1e-6)
    mpt = build_mpt_alibi_tensor(n, 2)[:, 0, 0].double().numpy()  # the (k - 1) = -1 column: -slope
    np.testing.assert_allclose(ours, -mpt, rtol=1e-6)


@pytest.mark.usefixtures("need_llamacpp")
def test_six_heads_three_way(run, policy):
    rows = run(policy, family="bloom", ref=HF_AND_LLAMACPP, kv="batched", overrides=SIX_HEADS)
    st = all_statuses(rows)
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    assert "alibi" in rows[0]["features"].split(";")
    for ref in ("hf", "llamacpp"):
        for layer in (0, 1):
            assert st[("impl", ref, layer, "attn_probs")] == "pass"
    # llama.cpp names no tensor for wo's output: it is derived as ffn_inp - layer_in,
    # and the row says so
    assert st[("impl", "llamacpp", 0, "attn_out")] == "pass"
    row = next(r for r in rows if (r["candidate"], r["reference"], r["layer"], r["probe"])
               == ("impl", "llamacpp", 0, "attn_out"))
    assert "derived as ffn_inp - layer_in" in row["reason"]
    assert st[("impl", "hf", 0, "attn_out")] == "pass"
    # the references agree on the attention, and part at the MLP (GELU table): a finding
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"


def test_non_power_of_two_slope_rule_is_what_six_heads_need(run, policy):
    """The power-of-two rule is exact for 4 heads and wrong for 6: the mutant that
    applies it everywhere passes bloom's default and fails its 6-head config."""
    from harness.mutants import applied, registry

    m = registry()["alibi-slopes-pow2-rule"]
    with applied(m):
        four = run(policy, family="bloom", ref="hf")
        six = run(policy, family="bloom", ref="hf", overrides=SIX_HEADS)
    assert all(r["status"] == "pass" for r in four)
    st = all_statuses(six)
    assert st[("impl", "hf", 0, "k_rope")] == "pass" and st[("impl", "hf", 0, "attn_probs")] == "fail"


@pytest.mark.usefixtures("need_llamacpp")
def test_qkv_reorder_is_needed(run, policy, monkeypatch):
    """Without the converter's per-head -> [Q; K; V] reorder llama.cpp reads the
    wrong columns: the capture notices at q."""
    from harness.families import get

    monkeypatch.setattr(get("bloom"), "_reorder_qkv", False)
    st = all_statuses(run(policy, family="bloom", ref=HF_AND_LLAMACPP))
    assert_llamacpp_fails_first_at_q(st)
    assert st[("llamacpp", "hf", 0, "q")] == "fail"


def test_residual_after_layernorm_is_refused():
    from harness.errors import UsageError
    from harness.families import get

    with pytest.raises(UsageError, match="apply_residual_connection_post_layernorm"):
        get("bloom").make_config({"apply_residual_connection_post_layernorm": True})
