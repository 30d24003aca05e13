"""qwen3_5_moe: qwen3_5_text's delta-net and gated attention layers three-way
in every KV mode with softmax experts and a sigmoid-gated shared expert in
every layer; the attention's Q gate and the shared expert's gate each caught
where they are broken."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


@pytest.mark.parametrize("kv", ["paged", "batched"])
def test_three_way_passes(run, policy, kv):
    # decode runs in the default matrix (families = "*")
    rows = run(policy, family="qwen3_5_moe", ref=HF_AND_LLAMACPP, kv=kv)
    assert not [r for r in rows if r["status"] not in ("pass", "not-exposed")]
    st = all_statuses(rows)
    assert {c for c, *_ in st} == {"impl", "hf_cached", "llamacpp"}
    for ref in ("hf", "hf_cached", "llamacpp"):
        for probe in ("rec_conv", "rec_q", "rec_v", "rec_beta", "rec_decay", "rec_out", "attn_branch"):
            assert st[("impl", ref, 0, probe)] == "pass", (ref, probe)  # layer 0: a delta-net layer
        assert st[("impl", ref, 1, "attn_branch")] == "pass"  # layer 1: gated attention
    for layer in range(4):  # the MoE FFN of every layer: the references agree
        assert st[("llamacpp", "hf", layer, "layer_out")] == "pass"


def test_a_q_gate_bug_fails_at_the_attention_layers(run, policy):
    with applied(registry()["q-gate-not-interleaved"]):
        st = all_statuses(run(policy, family="qwen3_5_moe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_branch")] == "pass"  # the delta-net layer has no Q gate
    assert st[("impl", "llamacpp", 1, "attn_branch")] == "fail"


def test_a_dropped_shared_expert_gate_fails_between_the_references(run, policy, monkeypatch):
    fam = get("qwen3_5_moe")
    cls = type(fam)

    def gate_open(name, data, config, variant=None):
        # sigmoid(0) = 0.5 for every token instead of sigmoid(shared_expert_gate(x))
        for n, d in cls.gguf_convert(fam, name, data, config, variant):
            yield n, (d * 0 if n.endswith("shared_expert_gate.weight") else d)

    monkeypatch.setattr(fam, "gguf_convert", gate_open)
    st = all_statuses(run(policy, family="qwen3_5_moe", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "resid_mid")] == "pass" and st[("llamacpp", "hf", 0, "layer_out")] == "fail"
