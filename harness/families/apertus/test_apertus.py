"""apertus: three-way on the per-head QK norm before RoPE, with the xIELU MLP's
per-layer parameters reaching llama.cpp as key arrays (written from HF's init
instead of the weights, every layer's output fails between the references);
a K norm taking Q's weight fails against llama.cpp; the file reads back with
each layer's xIELU parameters."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="apertus", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert st[("llamacpp", "hf", 1, "layer_out")] == "pass" and st[("impl", "llamacpp", 1, "attn_out")] == "pass"


def test_the_xielu_parameters_must_reach_llamacpp(run, policy, monkeypatch):
    monkeypatch.setattr(get("apertus"), "_write_xielu_from_weights", False)
    st = all_statuses(run(policy, family="apertus", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass" and st[("llamacpp", "hf", 0, "layer_out")] == "fail"
    # impl, teacher-forced, is judged on the attention alone
    assert st[("impl", "llamacpp", 1, "attn_out")] == "pass"


def test_a_k_norm_with_q_s_weight_fails_against_llamacpp(run, policy):
    with applied(registry()["k-norm-takes-q-weight"]):
        st = all_statuses(run(policy, family="apertus", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 0, "k_rope")] == "fail"


def test_the_file_reads_back_with_each_layer_s_xielu(gguf_export, gguf_import):
    import torch

    from harness.gguf.fastread import GGUFFile

    fam = get("apertus")
    config = fam.make_config({})
    model = fam.build_model(config, 0)
    path = str(gguf_export.export(fam, model, config, "f32", 0))
    v = GGUFFile(path).values  # llama-arch.cpp: "xielu.alpha_p", no arch prefix
    a0, a1 = (float(model.model.layers[i].mlp.act_fn.alpha_p) for i in (0, 1))
    assert a0 != a1 and v["xielu.alpha_p"] == pytest.approx([a0, a1], rel=1e-6)
    got = gguf_import.load(path).model
    for i in (0, 1):
        for key in ("alpha_p", "alpha_n", "beta", "eps"):
            assert torch.equal(getattr(got.model.layers[i].mlp.act_fn, key).float(),
                               getattr(model.model.layers[i].mlp.act_fn, key).float()), (i, key)
