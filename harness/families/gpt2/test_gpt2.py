"""gpt2: learned positions summed into layer 0's input, the Conv1D fused QKV the
converter transposes, no RoPE; and the per-layer scale llama.cpp does not read."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way(run, policy, kv):
    rows = run(policy, family="gpt2", ref=HF_AND_LLAMACPP, kv=kv)
    feats = set(rows[0]["features"].split(";"))
    assert {"qkv_bias", "o_bias", "layernorm"} <= feats and not {"rope_neox", "nope_layers"} & feats
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed", "finding")]
    st = all_statuses(rows)
    assert st[("llamacpp", "hf", -1, "embeddings")] == "pass"  # wte + wpe on both sides
    for layer in (0, 1):
        for ref in ("hf", "llamacpp"):
            assert st[("impl", ref, layer, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"  # the FFN's fp16 gelu table


def test_the_conv1d_weights_must_be_transposed(run, policy, monkeypatch):
    """GPT2Model.modify_tensors transposes c_attn / c_proj / c_fc (Conv1D [in, out] ->
    [out, in]); a file without it (square c_proj, so llama.cpp still loads the
    attention's weights read the wrong way) fails from q on, impl vs HF unchanged."""
    monkeypatch.setattr(get("gpt2"), "_converter_transposes", False)
    rows = run(policy, family="gpt2", ref=HF_AND_LLAMACPP, kv="decode")
    st = all_statuses(rows)
    assert st[("impl", "hf", 0, "attn_out")] == "pass"
    assert st.get(("impl", "llamacpp", 0, "q")) != "pass"
    assert not [r for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp" and r["status"] == "pass"
                and r["probe"] in ("q", "attn_branch", "resid_mid")]


@pytest.mark.parametrize("on,expect", [(False, "pass"), (True, "finding")])
def test_scale_by_inverse_layer_idx(run, policy, on, expect):
    st = all_statuses(run(policy, family="gpt2", ref=HF_AND_LLAMACPP, kv="decode",
                          overrides=(("scale_attn_by_inverse_layer_idx", on),)))
    assert st[("impl", "hf", 1, "attn_probs")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "pass"  # layer 0: scale / 1
    assert st[("impl", "llamacpp", 1, "attn_probs")] == expect
