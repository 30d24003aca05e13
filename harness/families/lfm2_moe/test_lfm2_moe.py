"""lfm2_moe: lfm2's short-conv and attention layers three-way on a model whose FFN
routes by sigmoid after the first dense layer (the experts split and stacked as the
converter merges them; the references agree on the FFN's output)."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses


@pytest.mark.usefixtures("need_llamacpp")
def test_three_way(run, policy):
    rows = run(policy, family="lfm2_moe", ref=HF_AND_LLAMACPP, kv="batched")
    assert not [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]
    st = all_statuses(rows)
    for ref in ("hf", "hf_cached", "llamacpp"):
        assert st[("impl", ref, 0, "attn_out")] == "pass" and st[("impl", ref, 2, "attn_out")] == "pass"
        assert st[("impl", ref, 1, "attn_out")] == "pass"
    assert st[("impl", "llamacpp", 2, "state_conv")] == "pass"
    # layer 2's FFN is the mixture of experts: llama.cpp's layer output agrees with HF's
    assert st[("llamacpp", "hf", 2, "layer_out")] == "pass" and st[("llamacpp", "hf", -1, "logits")] == "pass"
