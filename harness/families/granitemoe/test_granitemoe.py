"""granitemoe: three-way on granite's attention with top-k-softmax experts; the
routing is llama.cpp's (so the layer outputs agree, and a broken expert split
shows there), and granite's multipliers are impl's to get right."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="granitemoe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    # the MoE FFN is compared between the references, at every layer's output
    assert st[("llamacpp", "hf", 1, "layer_out")] == "pass"


def test_the_routing_is_top_k_of_the_logits_then_softmax(case_run, policy):
    """GraniteMoeTopKRouter.forward softmaxes the top-k logits; llama.cpp's
    build_moe_ffn softmaxes all, takes the top k and renormalises: one number."""
    r = case_run(policy, "granitemoe", ref="hf")
    assert r.config.num_local_experts == 4 and r.config.num_experts_per_tok == 2
    moe = r.base_model.model.layers[0].block_sparse_moe
    import torch

    x = torch.randn(5, r.config.hidden_size, generator=torch.Generator().manual_seed(1))
    _, w, idx = moe.router(x)
    p = torch.softmax(x @ moe.router.weight.T, dim=-1)
    top = p.gather(-1, idx)
    np.testing.assert_allclose(w.detach().numpy(), (top / top.sum(-1, keepdim=True)).detach().numpy(), rtol=1e-6)


def test_a_swapped_expert_split_fails_between_the_references(run, policy, monkeypatch):
    # the converter's split of the fused gate_up_proj, gate first (GraniteMoeModel.modify_tensors):
    # swapped, llama.cpp computes silu(up) * gate -- the attention agrees, the layer output not
    monkeypatch.setattr(get("granitemoe"), "_gate_first", False)
    st = all_statuses(run(policy, family="granitemoe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "fail"


def test_a_dropped_residual_multiplier_fails(run, policy):
    with applied(registry()["residual-multiplier-dropped"]):
        st = all_statuses(run(policy, family="granitemoe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_out")] == "pass"
    assert st[("impl", "llamacpp", 0, "resid_mid")] == "fail"


def test_a_squared_attention_multiplier_fails(run, policy):
    with applied(registry()["attn-multiplier-squared"]):
        st = all_statuses(run(policy, family="granitemoe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("impl", "hf", 0, "attn_probs")] == "fail" and st[("impl", "llamacpp", 0, "attn_probs")] == "fail"


def test_a_shared_expert_file_is_granitemoeshared_s(gguf_export, gguf_import, tmp_path):
    """One llama.cpp arch, two HF classes: a file with a shared expert is refused
    by granitemoe's reverse in one line, naming the family that reads it."""
    from harness.errors import UsageError

    fam = get("granitemoeshared")
    config = fam.make_config({})
    path = str(gguf_export.export(fam, fam.build_model(config, 5), config, "f32", 5, None))
    assert gguf_import.load(path).family.name == "granitemoeshared"
    with pytest.raises(UsageError, match="read it as --family granitemoeshared"):
        gguf_import.load(path, "granitemoe")
