"""ernie4_5_moe: three-way on ernie4_5's interleaved RoPE with a dense lead
layer, biased-selection experts and shared experts; the selection bias must
reach llama.cpp (without it the MoE layer's output fails between the
references); a neox rotation in impl fails; the converter's shared width and
the MoE step llama.cpp cannot load are refused on --gguf in one line."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="ernie4_5_moe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    # layer 0 is dense (the lead), layer 1 MoE: both layer outputs checked between the references
    assert st[("llamacpp", "hf", 0, "layer_out")] == st[("llamacpp", "hf", 1, "layer_out")] == "pass"
    assert st[("impl", "llamacpp", 1, "attn_out")] == "pass"  # ernie4-5-moe.cpp names it


def test_the_selection_bias_must_reach_llamacpp(run, policy, monkeypatch):
    """Without exp_probs_b in the file llama.cpp selects by the plain softmax; HF adds
    e_score_correction_bias (seeded here, 0.1 x N(0, 1)) before its top-k: the MoE
    layer's output differs -- the comparison of what follows the attention can fail."""
    monkeypatch.setattr(get("ernie4_5_moe"), "_write_selection_bias", False)
    st = all_statuses(run(policy, family="ernie4_5_moe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"  # the dense lead
    assert st[("llamacpp", "hf", 1, "attn_out")] == "pass" and st[("llamacpp", "hf", 1, "layer_out")] == "fail"


def test_a_neox_rotation_fails_against_llamacpp(run, policy):
    with applied(registry()["rope-layout-swapped"]):
        st = all_statuses(run(policy, family="ernie4_5_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"


def test_the_file_says_the_moe_layout(gguf_export, gguf_import, tmp_path):
    from harness.gguf.fastread import GGUFFile

    fam = get("ernie4_5_moe")
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0)
    v = GGUFFile(str(path)).values
    assert v["ernie4_5-moe.leading_dense_block_count"] == 1 and v["ernie4_5-moe.interleave_moe_layer_step"] == 1
    # conversion/ernie.py: intermediate_size // num_key_value_heads, HF's 24 * 2 here
    assert v["ernie4_5-moe.expert_shared_feed_forward_length"] == 48
    back = gguf_import.load(str(path)).config
    assert (back.moe_layer_start_index, back.moe_num_shared_experts, back.moe_intermediate_size) == (1, 2, 24)


def test_what_llamacpp_cannot_load_is_refused_in_one_line():
    fam = get("ernie4_5_moe")
    assert fam.lc_refusal(fam.make_config({})) is None
    for over in ({"intermediate_size": 128}, {"moe_layer_interval": 2}):
        why = fam.lc_refusal(fam.make_config(over))
        assert why and "\n" not in why and "--ref hf" in why, over
        assert fam.hf_refusal(fam.make_config(over)) is None
