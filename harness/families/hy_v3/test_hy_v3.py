"""hy_v3: three-way on the per-head QK norm with a dense layer, sigmoid experts
with a seeded selection bias, the routed scale and a shared expert; the routed
scale must reach llama.cpp (the MoE comparison can fail); a broken K norm in
impl fails against both references (at k_rope against HF; at attn_probs against
llama.cpp, whose graph names no rotated K)."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    rows = run(policy, family="hy_v3", ref=HF_AND_LLAMACPP, kv="paged")
    st = all_statuses(rows)
    bad = [k for k, s in st.items() if s != "pass" and not (s == "not-exposed" and k[3] in ("q_rope", "k_rope"))]
    assert st and not bad, bad[:4]
    assert {"qk_norm_head", "gqa", "rope_neox"} <= set(rows[0]["features"].split(";"))
    assert st[("impl", "llamacpp", 0, "attn_probs")] == st[("impl", "hf", 0, "k_rope")] == "pass"
    assert st[("llamacpp", "hf", 1, "layer_out")] == "pass"  # the sparse layer


def test_the_selection_bias_is_seeded_and_named_as_hy_v3_cpp_loads_it(gguf_export):
    import gguf

    from harness import families

    fam = families.get("hy_v3")
    config = fam.make_config({})
    model = fam.build_model(config, 5)
    bias = model.model.layers[1].mlp.e_score_correction_bias
    assert float(bias.abs().max()) > 0  # seeded: a reference that drops it would show
    names = {t.name for t in gguf.GGUFReader(str(gguf_export.export(fam, model, config, "f32", 5, None))).tensors}
    assert "blk.1.exp_probs_b" in names and "blk.1.exp_probs_b.bias" not in names
    assert "blk.0.ffn_gate_inp.weight" not in names and "blk.0.ffn_gate.weight" in names  # layer 0 dense


def test_the_routed_scale_must_reach_llamacpp(run, policy, monkeypatch):
    from harness.families import get

    fam = get("hy_v3")
    real = fam.gguf_params

    def unscaled(w, config, variant=None):
        real(w, config, variant)
        w.add_expert_weights_scale(1.0)  # the last write of a key wins in the GGUF writer's dict

    monkeypatch.setattr(fam, "gguf_params", unscaled)
    st = all_statuses(run(policy, family="hy_v3", ref=HF_AND_LLAMACPP, kv="decode"))
    # the dense layer 0 agrees; the sparse layer 1's experts differ by the scale; impl,
    # teacher-forced on llama.cpp's own input, still agrees with its attention
    assert st[("llamacpp", "hf", 0, "layer_out")] == st[("llamacpp", "hf", 1, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 1, "layer_out")] == "fail"
    assert st[("impl", "llamacpp", 1, "attn_out")] == "pass"


def test_a_broken_k_norm_fails_against_both_references(run, policy):
    with applied(registry()["k-norm-takes-q-weight"]):
        st = all_statuses(run(policy, family="hy_v3", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("impl", "hf", 0, "q_rope")] == "pass" and st[("impl", "hf", 0, "k_rope")] == "fail"
    assert st[("impl", "llamacpp", 0, "k")] == "pass" and st[("impl", "llamacpp", 0, "attn_probs")] == "fail"
