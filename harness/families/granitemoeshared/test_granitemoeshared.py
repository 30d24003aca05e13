"""granitemoeshared: three-way on granitemoe's attention with an ungated shared
expert; the shared expert is compared between the references (a swapped split
fails at the layer output), its width key read back."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="granitemoeshared", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_the_shared_expert_is_there(case_run, policy):
    r = case_run(policy, "granitemoeshared", ref="hf")
    layer = r.base_model.model.layers[0]
    assert layer.shared_mlp is not None and layer.shared_mlp.input_linear.weight.shape[0] == 2 * 48


def test_a_swapped_shared_split_fails_between_the_references(run, policy, monkeypatch):
    # GraniteMoeModel.modify_tensors: shared_mlp.input_linear split gate first; swapped,
    # llama.cpp's shared expert is silu(up) * gate -- attention agrees, the layer output not
    monkeypatch.setattr(get("granitemoeshared"), "_shared_gate_first", False)
    st = all_statuses(run(policy, family="granitemoeshared", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "fail"


def test_a_dropped_qkv_bias_fails(run, policy):
    with applied(registry()["qkv-bias-dropped"]):
        st = all_statuses(run(policy, family="granitemoeshared", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "fail"
