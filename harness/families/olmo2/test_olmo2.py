"""olmo2: no input norm, the whole-row QK norm, the post-attention norm."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_decorations_and_probes(run, policy):
    rows = run(policy, family="olmo2", ref=HF_AND_LLAMACPP, kv="paged")
    feats = set(rows[0]["features"].split(";"))
    assert {"qk_norm_row", "post_norm", "rope_neox", "gqa"} <= feats
    st = all_statuses(rows)
    for layer in (0, 1):
        # llama.cpp's olmo2 has no attn_norm: the attention reads the layer input itself
        assert st[("impl", "llamacpp", layer, "attn_in")] == "not-exposed"
        for ref in ("hf", "llamacpp"):
            for probe in ("q", "k", "q_rope", "k_rope", "attn_probs", "attn_out", "resid_mid"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)


def test_row_norm_is_not_a_per_head_norm(run, policy):
    """The whole-row statistic matters: qwen3's per-head rule on olmo2's weights fails."""
    from harness.mutants import applied, registry

    with applied(registry()["qk-norm-row-per-head"]):
        rows = run(policy, family="olmo2", ref="llamacpp")
    st = {(r["layer"], r["probe"]): r["status"] for r in rows if r["candidate"] == "impl"}
    assert st[(0, "k")] == "pass" and st[(0, "q_rope")] == "fail"
