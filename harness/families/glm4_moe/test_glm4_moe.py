"""glm4_moe: three-way on GLM-4.5's attention (neox partial RoPE, QKV bias, the
optional QK norm on both sides of its switch) with a dense first layer and a
sigmoid-routed MoE whose expert bias and shared expert the references compare."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="glm4_moe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_the_tiny_config_has_a_dense_layer_then_an_moe_layer(case_run, policy):
    r = case_run(policy, "glm4_moe", ref="hf")
    layers = r.base_model.model.layers
    assert type(layers[0].mlp).__name__ == "Glm4MoeMLP" and type(layers[1].mlp).__name__ == "Glm4MoeMoE"
    assert float(layers[1].mlp.gate.e_score_correction_bias.abs().max()) > 0.1  # seeded, not HF's zeros
    assert {"qk_norm_head", "partial_rotary", "qkv_bias"} <= set(r.features)
    assert len(r.layer_cfgs[0].rope.inv_freq) == 4  # 8 of head_dim 16 rotate (factor 0.5)


def test_without_the_qk_norm_both_agree(run, policy):
    # use_qk_norm false: HF builds no q_norm / k_norm, the file has no attn_q_norm, and
    # glm4-moe.cpp skips the norm (TENSOR_NOT_REQUIRED)
    rows = run(policy, family="glm4_moe", ref=HF_AND_LLAMACPP, kv="decode", overrides=(("use_qk_norm", False),))
    assert "qk_norm_head" not in rows[0]["features"].split(";")
    st = all_statuses(rows)
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_a_dropped_expert_bias_fails_between_the_references(run, policy, monkeypatch):
    # the choice is made on sigmoid + e_score_correction_bias (Glm4MoeTopkRouter.forward;
    # build_moe_ffn's exp_probs_b): a file with the bias zeroed routes some tokens elsewhere
    fam = get("glm4_moe")
    cls = type(fam)

    def zeroed(name, data, config, variant=None):
        for n, d in cls.gguf_convert(fam, name, data, config, variant):
            yield n, (d * 0 if "e_score_correction" in n else d)

    monkeypatch.setattr(fam, "gguf_convert", zeroed)
    st = all_statuses(run(policy, family="glm4_moe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 1, "attn_out")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"  # layer 0 is dense
    assert st[("llamacpp", "hf", 1, "layer_out")] == "fail"


def test_a_broken_qk_norm_fails(run, policy):
    with applied(registry()["k-norm-takes-q-weight"]):
        st = all_statuses(run(policy, family="glm4_moe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 0, "k_rope")] == "fail"
    assert st[("impl", "hf", 0, "k_rope")] == "fail"


def test_a_partial_rotary_bug_fails(run, policy):
    with applied(registry()["partial-rotary-pairs-from-tail"]):
        st = all_statuses(run(policy, family="glm4_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"
