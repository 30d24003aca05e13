"""hunyuan_v1_moe: three-way on hunyuan's post-RoPE QK norm with routed
experts and a shared MLP in every layer (the layer output checked between the
references), the NTK-alpha RoPE too; a post-RoPE norm that skips K fails
against llama.cpp; the file's widths are HF's one intermediate_size."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

NTK = (("rope_parameters", {"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0, "factor": 1.0}),
       ("max_position_embeddings", 32768))


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="hunyuan_v1_moe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert st[("llamacpp", "hf", 1, "layer_out")] == "pass" and st[("impl", "llamacpp", 1, "attn_out")] == "pass"


def test_ntk_alpha_rope_three_way(run, policy):
    st = all_statuses(run(policy, family="hunyuan_v1_moe", ref=HF_AND_LLAMACPP, kv="batched", overrides=NTK))
    assert st[("impl", "llamacpp", 1, "q_rope")] == "pass" and all(s == "pass" for s in st.values())


def test_a_post_rope_norm_that_skips_k_fails_against_llamacpp(run, policy):
    with applied(registry()["post-rope-norm-skips-k"]):
        st = all_statuses(run(policy, family="hunyuan_v1_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 0, "k_rope")] == "fail"


def test_the_file_s_widths_are_hf_s_one_intermediate_size(gguf_export, gguf_import):
    from harness.gguf.fastread import GGUFFile

    fam = get("hunyuan_v1_moe")
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0)
    v = GGUFFile(str(path)).values
    assert v["hunyuan-moe.feed_forward_length"] == v["hunyuan-moe.expert_shared_feed_forward_length"] == 48
    assert v["hunyuan-moe.expert_used_count"] == 2 and v["hunyuan-moe.expert_count"] == 4
    back = gguf_import.load(str(path)).config
    assert (back.intermediate_size, back.num_experts, back.moe_topk) == (48, 4, 2)
