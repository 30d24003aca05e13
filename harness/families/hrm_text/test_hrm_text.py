"""hrm_text: the L and H stacks re-run in cycles, each invocation captured and
judged as its own layer (``Family.invocation_order``), three-way; a wrong
invocation order and a planted gate bug fail; HF's prefix-LM mask on both
sides (off without ``token_type_ids``, which the harness never passes; on with
them, a mask llama.cpp does not implement)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

N_SLOTS = 12  # 2 layers per stack x H_cycles 2 x (L_cycles 2 + 1)
STACK_FIRST = range(0, N_SLOTS, 2)  # the first layer of each stack invocation: unnamed input in llama.cpp
PROBES = ("q", "q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out", "resid_mid")


def test_every_invocation_is_judged_three_way(run, policy):
    # decode here; batched and paged three-way: tests/test_families.py test_family_three_way
    rows = run(policy, family="hrm_text", ref=HF_AND_LLAMACPP, kv="decode")
    assert {"output_gate", "rope_neox"} <= set(rows[0]["features"].split(";"))
    st = all_statuses(rows)
    for layer in range(N_SLOTS):
        for ref in ("hf", "hf_cached"):
            for probe in PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        if layer == 0:
            # the first L invocation reads embd + hrm.z_l_init (a weight) in an unnamed ggml_add
            assert st[("impl", "llamacpp", layer, "layer_in")] == "not-exposed", layer
        else:
            # a stack's first layer is fed the float32 sum of the named zH and zL (lc_input_sum)
            for probe in PROBES:
                assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
            # the references agree on the inputs, the derived stack inputs included
            assert st[("llamacpp", "hf", layer, "layer_in")] == "pass", layer
        # ... and invocation by invocation
        assert st[("llamacpp", "hf", layer, "attn_out")] == "pass", layer
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"
    why = {r["reason"] for r in rows if r["status"] == "not-exposed"}
    assert len(why) == 1 and "ggml_add(zH, zL)" in why.pop()
    derived = {r["layer"] for r in rows if "float32 sum" in (r["reason"] or "")}
    assert derived == set(STACK_FIRST) - {0}, derived
    assert not [k for k, s in st.items() if s not in ("pass", "not-exposed")]


def test_invocations_of_one_module_are_distinct_layers():
    """HF's capture records each call of a module as its own layer: the L stack's
    module 0 runs slots 0, 2 (h = 0, l = 0, 1) and 6, 8 (h = 1); each call's input
    differs, so a capture that kept one call (the last) for all would make them equal."""
    from harness.families import get
    from harness.references.hf.capture import capture

    fam = get("hrm_text")
    config = fam.make_config({})
    order = fam.invocation_order(config)
    assert order == [0, 1, 0, 1, 2, 3, 0, 1, 0, 1, 2, 3]
    model = fam.build_model(config, seed=0)
    cfgs = fam.layer_configs(config)
    got = capture(fam, model, config, cfgs, np.arange(8)[None] % config.vocab_size, probes=["layer_in", "q"])
    slots = [s for s, m in enumerate(order) if m == 0]
    assert slots == [0, 2, 6, 8]
    for a in slots:
        for b in slots:
            if a < b:
                assert not np.allclose(got[f"L{a}.layer_in"], got[f"L{b}.layer_in"]), (a, b)


def test_a_wrong_invocation_order_fails(run, policy, monkeypatch):
    """Declared orders the forward does not run fail: one that lists each module
    once (the default's) stops the HF capture (a module ran more often than
    declared); one that swaps the two layers of each stack gives impl the other
    module's weights, which llama.cpp (slot-indexed by its own graph) rejects."""
    from harness.families import get
    from harness.references.hf.capture import capture

    fam = get("hrm_text")
    config = fam.make_config({})
    model = fam.build_model(config, seed=0)
    cfgs = fam.layer_configs(config)
    monkeypatch.setattr(type(fam), "invocation_order", lambda self, config: None)
    with pytest.raises(RuntimeError, match="decoder layer module 0 ran 2 times in one forward"):
        capture(fam, model, config, cfgs, np.arange(8)[None], probes=["q"])
    monkeypatch.setattr(type(fam), "invocation_order", lambda self, config: [1, 0, 1, 0, 3, 2] * 2)
    st = all_statuses(run(policy, family="hrm_text", ref="llamacpp"))
    assert st[("impl", "llamacpp", 1, "q")] == "fail"


def test_a_broken_gate_fails_against_both_references(run, policy):
    """The sigmoid gate squashed by tanh fails at the branch against HF and
    llama.cpp's ``attn_gated``, and nothing before the branch does."""
    with applied(registry()["output-gate-tanh-for-sigmoid"]):
        st = all_statuses(run(policy, family="hrm_text", ref=HF_AND_LLAMACPP))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 1, "attn_heads")] == "pass"
        assert st[("impl", ref, 1, "attn_branch")] == "fail", ref


def test_prefix_lm_both_sides():
    """``prefix_lm`` (HF's default True) is a non-causal mask only with
    ``token_type_ids`` (HrmTextModel.forward: ``block_sequence_ids``). Without them --
    the harness's forward -- it is causal whatever the flag, as llama.cpp always
    is (hrm-text.cpp: "prefix-LM prefill is not implemented"); with them the prefix
    attends to later prefix tokens, a model llama.cpp does not compute."""
    import torch

    from harness.families import get

    fam = get("hrm_text")
    ids = torch.arange(6)[None] % 100 + 3
    tt = torch.tensor([[1, 1, 1, 0, 0, 0]])
    out = {}
    for flag in (True, False):
        config = fam.make_config({"prefix_lm": flag})
        model = fam.build_model(config, seed=0)
        with torch.no_grad():
            out[flag, False] = model(input_ids=ids).logits
            out[flag, True] = model(input_ids=ids, token_type_ids=tt).logits
    causal = out[False, False]
    assert torch.equal(out[True, False], causal)  # the flag alone changes nothing
    assert torch.equal(out[False, True], causal)  # token_type_ids ignored without the flag
    prefix = out[True, True]
    # position 0 sees positions 1, 2 of the prefix: it changes; none of the causal
    # rows' values would
    assert not torch.allclose(prefix[0, 0], causal[0, 0])


def test_attention_bias_is_hf_only(run, policy):
    """attention_bias=true biases q/k/v/gate/o_proj (HrmTextAttention.__init__);
    hrm-text.cpp loads no attn_gate / attn_output bias, so llama.cpp is refused in
    one line and impl (the gate's bias ``bg``) is judged against HF."""
    from harness.families import get

    fam = get("hrm_text")
    why = fam.lc_refusal(fam.make_config({"attention_bias": True}))
    assert why and "attn_gate" in why and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None
    rows = run(policy, family="hrm_text", ref="hf", overrides=(("attention_bias", True),))
    assert "qkv_bias" in rows[0]["features"].split(";")
    assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"][:3]
