"""gemma4: the attention half three-way (HF, its cached path, llama.cpp) on every layer --
the global layers' own head width and proportional RoPE, the shared-KV layers through
impl's ``kv_source``, K = V on the global layers --, and each trap on both sides of its
switch: proportional RoPE is not partial rotary, the two KV-sharing rules, the fp16 GELU
table behind the one finding."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

N_LAYERS = 6
SHARED = (4, 5)  # the tiny's last two layers read layers 2 and 3's K / V on both sides
PROBES = ("attn_in", "q", "q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out", "resid_mid")
OWN_KV = ("k", "v", "k_rope")


@pytest.mark.usefixtures("need_llamacpp")
def test_the_attention_half_is_judged_three_way(run, policy):
    # decode here; batched and paged three-way: tests/test_families.py test_family_three_way
    rows = run(policy, family="gemma4", ref=HF_AND_LLAMACPP, kv="decode")
    assert {"kv_shared", "v_norm", "qk_norm_head", "post_norm", "sliding_window", "per_layer_theta",
            "attn_scale"} <= set(rows[0]["features"].split(";"))
    st = all_statuses(rows)
    for layer in range(N_LAYERS):
        for ref in ("hf", "hf_cached", "llamacpp"):
            for probe in PROBES + (() if layer in SHARED else OWN_KV):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
            # a shared layer has no K / V of its own on any side
            assert layer not in SHARED or not any(("impl", ref, layer, p) in st for p in ("k", "v"))
    # the references agree on layer 0's attention half; from its MLP on, ggml's fp16 GELU
    # table (findings.toml)
    for probe in ("layer_in",) + PROBES + OWN_KV:
        assert st[("llamacpp", "hf", 0, probe)] == "pass", probe
    assert st[("llamacpp", "hf", 0, "layer_out")] == "finding"
    assert not [k for k, s in st.items() if s not in ("pass", "finding")]


@pytest.mark.usefixtures("need_llamacpp")
def test_k_eq_v_global_layers(case_run, run, policy):
    """attention_k_eq_v (the 26B / 31B checkpoints): a global layer has no v_proj; V is the
    K projection's output (HF), ``Vcur = Kcur`` (llama.cpp). impl, its wv taken as wk, passes
    on every probe against both; both sides' v equals their k."""
    over = (("attention_k_eq_v", True), ("num_global_key_value_heads", 1))
    r = case_run(policy, "gemma4", ref=HF_AND_LLAMACPP, overrides=over)
    assert r.layer_cfgs[1].n_kv_heads == 1 and r.layer_cfgs[0].n_kv_heads == 2
    for ref in ("hf", "llamacpp"):
        probes = r.capture(ref).probes
        np.testing.assert_array_equal(probes["L1.k"], probes["L1.v"])
    st = all_statuses(run(policy, family="gemma4", ref=HF_AND_LLAMACPP, overrides=over))
    for layer in (1, 3):
        for ref in ("hf", "llamacpp"):
            for probe in PROBES + OWN_KV:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)


def test_proportional_rope_is_not_partial_rotary(run, policy, monkeypatch):
    """The global layers turn the first quarter of the rotate-half PAIRS of the whole head
    (HF _compute_proportional_rope_parameters; llama.cpp rope_freqs 1e30 on the rest), not
    the leading quarter of its channels: impl built as ordinary partial rotary fails at the
    global layers' q_rope and passes at the sliding ones."""
    from harness.families import base

    st = all_statuses(run(policy, family="gemma4", ref="hf"))
    assert st[("impl", "hf", 1, "q_rope")] == "pass"
    orig = base.rope_from_config

    def partial(config, layer_type=None, **kw):
        if layer_type == "full_attention":
            rp = {**config.rope_parameters[layer_type], "rope_type": "default"}
            config = type(config).from_dict({**config.to_dict(), "rope_parameters": {
                **config.rope_parameters, layer_type: rp}})
        return orig(config, layer_type, **kw)

    monkeypatch.setattr(base, "rope_from_config", partial)
    st = all_statuses(run(policy, family="gemma4", ref="hf"))
    assert st[("impl", "hf", 1, "q_rope")] == "fail"
    assert st[("impl", "hf", 0, "q_rope")] == "pass"


def test_the_two_sharing_rules():
    """HF: the last ``num_kv_shared_layers`` layers read the last earlier layer of their type
    (Gemma4TextConfig.kv_sharing_modes); llama.cpp: from ``n - shared``, that index minus 2
    (sliding) or minus 1 (full). They agree at E2B (35 layers, 20 shared, every 5th full) and
    at the tiny; not at 3 shared of the tiny, which llama.cpp is refused with both lines."""
    from harness.families import get
    from harness.families.gemma3n import kv_sources
    from harness.families.gemma4 import lc_kv_sources

    fam = get("gemma4")
    e2b = fam.make_config({"num_hidden_layers": 35, "num_kv_shared_layers": 20, "layer_types": [
        "full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(35)]})
    assert kv_sources(e2b) == lc_kv_sources(e2b) and kv_sources(e2b)[15:17] == [13, 13]
    tiny = fam.make_config({})
    assert kv_sources(tiny) == lc_kv_sources(tiny) == [None] * 4 + [2, 3]
    assert fam.lc_refusal(tiny) is None
    three = fam.make_config({"num_kv_shared_layers": 3})
    assert kv_sources(three)[3] == 1 and lc_kv_sources(three)[3] == 2
    msg = fam.lc_refusal(three)
    assert "llama-model.cpp:2780-2788" in msg and "kv_sharing_modes" in msg


@pytest.mark.usefixtures("need_llamacpp")
def test_gelu_finding_is_the_fp16_table(case_run, policy):
    """The layer_out finding pinned on its cause: HF's own FFN half (without per-layer inputs,
    times layer_scalar) run with ggml's fp16 GELU table on llama.cpp's resid_mid reproduces
    llama.cpp's layer_out; the exact GELU does not."""
    from harness.families import get
    from harness.testing.ggml_gelu import assert_fp16_gelu_explains_layer_out, gemma_ffn_half

    r = case_run(policy, "gemma4", ref=HF_AND_LLAMACPP, kv="decode",
                 overrides=(("hidden_size_per_layer_input", 0),))
    layer = get("gemma4").decoder_layers(r.base_model)[0]
    half = gemma_ffn_half(layer)
    assert_fp16_gelu_explains_layer_out(r.capture("llamacpp").probes,
                                        lambda x, act: half(x, act) * layer.layer_scalar, layer.mlp.act_fn)


@pytest.mark.usefixtures("need_llamacpp")
def test_no_softcap_is_capped_at_30_by_llamacpp(run, policy):
    """final_logit_softcapping None: the converter writes no key and gemma4.cpp falls back to
    llama_hparams' 30 (findings.toml, found by the fuzz): the logits differ (the finding), and
    with the cap written they agree -- the same model otherwise."""
    rows = run(policy, family="gemma4", ref=HF_AND_LLAMACPP, overrides=(("final_logit_softcapping", None),))
    logits = next(r for r in rows if (r["candidate"], r["reference"], r["probe"]) == ("llamacpp", "hf", "logits"))
    assert logits["status"] == "finding" and "f_final_logit_softcapping = 30.0f" in logits["reason"]
    assert logits["nmse"] > 1e-3
    rows = run(policy, family="gemma4", ref=HF_AND_LLAMACPP, overrides=(("final_logit_softcapping", 30.0),))
    capped = next(r for r in rows if (r["candidate"], r["reference"], r["probe"]) == ("llamacpp", "hf", "logits"))
    assert capped["nmse"] < 1e-6, capped  # the GELU table's drift alone (findings.toml's first)
    assert all(r["status"] == "pass" for r in rows if r["candidate"] == "impl" and r["probe"] != "*")
