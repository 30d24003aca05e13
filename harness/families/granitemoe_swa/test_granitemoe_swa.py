"""granitemoe_swa specifics: granite_swa's attention (sinks, windows; HF's
attn_probs not compared, its heads are) with experts and a shared expert whose
fused tensors the converter keeps fused; planted bugs fail."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged, mixed chunks here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="granitemoe_swa", ref=HF_AND_LLAMACPP, kv="paged", schedule="mixed"))
    bad = [k for k, s in st.items() if s not in ("pass", "not-exposed")]
    assert st and not bad, bad[:4]
    assert {k for k, s in st.items() if s == "not-exposed"} == {
        ("impl", ref, i, "attn_probs") for ref in ("hf", "hf_cached") for i in range(4)}
    # the experts and the shared expert are compared between the references at every layer output
    assert all(st[("llamacpp", "hf", i, "layer_out")] == "pass" for i in range(4))
    assert all(st[("impl", "llamacpp", i, "attn_probs")] == "pass" for i in range(4))


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "granitemoe_swa", ref="hf")
    assert {"sinks", "sliding_window", "attn_scale", "residual_multiplier"} <= set(r.features)
    layer = r.base_model.model.layers[1]
    assert layer.shared_mlp is not None and layer.block_sparse_moe.experts.gate_up_proj.shape == (4, 64, 64)


def test_gguf_keeps_the_fused_experts(case_run, policy, tmp_path):
    import gguf

    r = case_run(policy, "granitemoe_swa", ref="hf")
    fam = get("granitemoe_swa")
    names = dict(fam.gguf_tensors(r.base_model, r.config))
    layer = r.base_model.model.layers[0]
    # GraniteMoeSWAModel.modify_tensors: FFN_GATE_UP_EXP and FFN_UP_SHEXP, gate rows first, unsplit
    np.testing.assert_array_equal(names["blk.0.ffn_gate_up_exps.weight"],
                                  layer.block_sparse_moe.experts.gate_up_proj.detach().numpy())
    np.testing.assert_array_equal(names["blk.0.ffn_up_shexp.weight"],
                                  layer.shared_mlp.input_linear.weight.detach().numpy())
    assert "blk.0.attn_sinks.weight" in names and "blk.0.ffn_gate_exps.weight" not in names
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "granite_swa")
    fam.gguf_params(w, r.config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert kv["granite_swa.expert_shared_feed_forward_length"] == 48
    assert kv["granite_swa.expert_count"] == 4 and kv["granite_swa.expert_used_count"] == 2


def test_a_swapped_fused_expert_fails_between_the_references(run, policy, monkeypatch):
    """The fused gate_up written with its halves swapped: llama.cpp computes
    silu(up) * gate -- the attention agrees, the layer output does not."""
    monkeypatch.setattr(get("granitemoe_swa"), "_gate_first", False)
    st = all_statuses(run(policy, family="granitemoe_swa", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "fail"


def test_a_sink_scaled_like_a_key_fails(run, policy):
    with applied(registry()["sink-scaled-like-a-key"]):
        st = all_statuses(run(policy, family="granitemoe_swa", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "fail" and st[("impl", "hf", 0, "attn_out")] == "fail"


def test_a_dropped_residual_multiplier_fails(run, policy):
    with applied(registry()["residual-multiplier-dropped"]):
        st = all_statuses(run(policy, family="granitemoe_swa", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_out")] == "pass"
    assert st[("impl", "llamacpp", 0, "resid_mid")] == "fail"
