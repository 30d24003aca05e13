"""cohere2_moe: three-way in every KV mode on cohere2's layer (parallel block,
NoPE full layers, interleaved RoPE) with a RoPE'd dense full-attention prefix
and routed + shared experts; the router's normalisation where llama.cpp's
softmax differs (a finding), the converter's refusals."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

UNNORMED = (("norm_topk_prob", False),)


@pytest.mark.parametrize("kv", ["paged", "batched"])
def test_three_way_passes(run, policy, kv):
    # decode runs in the default matrix (families = "*")
    rows = run(policy, family="cohere2_moe", ref=HF_AND_LLAMACPP, kv=kv)
    feats = set(rows[0]["features"].split(";"))
    assert {"parallel_residual", "layernorm", "rope_interleaved", "nope_layers", "sliding_window"} <= feats
    st = all_statuses(rows)
    assert {c for c, *_ in st} == {"impl", "hf_cached", "llamacpp"}
    assert not [k for k, s in st.items() if s not in ("pass", "not-exposed")]
    # not exposed: only the attention's wo product (cohere2moe.cpp names none)
    assert {k[2:] for k, s in st.items() if s == "not-exposed"} == {(i, "attn_out") for i in range(4)}


def test_the_dense_prefix_rotates_and_the_full_layers_do_not(run, policy, monkeypatch):
    fam = get("cohere2_moe")
    config = fam.make_config({})
    # Cohere2MoeAttention.force_rope: the dense prefix (layer 0) is full attention AND rotated
    assert config.layer_types[:3] == ["full_attention", "sliding_attention", "full_attention"]
    assert [lc.rope is not None for lc in fam.layer_configs(config)] == [True, True, False, True]
    # impl that treats the prefix as cohere2's NoPE full layer fails there, against both
    monkeypatch.setattr(fam, "uses_rope", fam._is_sliding)
    st = all_statuses(run(policy, family="cohere2_moe", ref=HF_AND_LLAMACPP, kv="decode"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q")] == "pass" and st[("impl", ref, 0, "q_rope")] == "fail"


def test_a_rotated_nope_layer_fails(run, policy):
    with applied(registry()["nope-layer-rotated"]):
        st = all_statuses(run(policy, family="cohere2_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 1, "q_rope")] == "pass" and st[("impl", "llamacpp", 2, "q_rope")] == "fail"


def test_unnormalised_softmax_routing_is_a_finding_between_the_references(run, policy):
    st = all_statuses(run(policy, family="cohere2_moe", ref=HF_AND_LLAMACPP, kv="decode", overrides=UNNORMED))
    # teacher-forced impl sees each reference's own input: it agrees with both (attn_out: not exposed)
    assert all(s in ("pass", "not-exposed") for (c, _r, *_), s in st.items() if c == "impl")
    ref = {k[2:]: s for k, s in st.items() if k[:2] == ("llamacpp", "hf")}
    assert ref[(0, "layer_out")] == ref[(1, "attn_branch")] == "pass"  # the dense prefix and L1's attention agree
    assert ref[(1, "layer_out")] == ref[(3, "layer_out")] == ref[(-1, "logits")] == "finding"


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "cohere2_moe", "llamacpp", "hf", "layer_out", dict(UNNORMED), nmse=0.003, layer=3)
    assert not finding(pol, "cohere2_moe", "llamacpp", "hf", "layer_out", {}, nmse=0.003, layer=3)
    # bounded by its measured size
    assert not finding(pol, "cohere2_moe", "llamacpp", "hf", "layer_out", dict(UNNORMED), nmse=0.3, layer=3)


def test_the_rms_norm_variant_passes_three_way(run, policy):
    # Cohere2MoeDecoderLayer: RMSNorm iff rms_norm_eps; cohere2moe.cpp: LLM_NORM_RMS iff the file has its eps
    st = all_statuses(run(policy, family="cohere2_moe", ref=HF_AND_LLAMACPP, kv="decode", overrides=(("rms_norm_eps", 1e-6),)))
    assert st and all(s in ("pass", "not-exposed") for s in st.values())


def test_summed_shared_experts_are_refused_against_llamacpp(cli_main, capsys):
    rc = cli_main(["run", "--family", "cohere2_moe", "--ref", "llamacpp", "--set", "shared_expert_combination_strategy=sum"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "shared_expert_combination_strategy 'sum'" in err
