"""kimi_linear specifics: the KDA layers judged against HF, HF's cached path and
llama.cpp (what its graph names) with their states; NoPE MLA; the naive form
meets HF only, because llama.cpp's kimi-linear cannot run it (checked, not
assumed)."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses
from harness.features import layer_features

FAMILY = "kimi_linear"


def test_kda_layers_three_way(run, policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv="batched")
    assert not [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]
    st = all_statuses(rows)
    for layer in (0, 2):
        assert {r["layer_kind"] for r in rows if r["layer"] == layer} == {"kimi_delta"}
        for ref in ("hf", "hf_cached"):
            for probe in ("rec_conv_in", "rec_conv", "rec_q", "rec_k", "rec_v", "rec_beta", "rec_decay", "rec_z",
                          "rec_out", "attn_branch", "attn_out"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        # kimi-linear.cpp names the per-key decay, the gate's input, y and kda_out; not the convs
        for probe in ("rec_decay", "rec_z", "rec_out", "attn_out", "state_conv", "state_rec"):
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        for probe in ("rec_conv", "rec_q", "rec_beta", "attn_branch"):
            assert st[("impl", "llamacpp", layer, probe)] == "not-exposed"
        # llama.cpp's three convs' states, side by side in one r_l row, are HF's one conv state
        assert st[("llamacpp", "hf_cached", layer, "state_conv")] == "pass"
    refs = {(r["layer"], r["probe"]) for r in rows if r["candidate"] == "llamacpp" and r["status"] == "pass"}
    assert {(0, "attn_out"), (2, "attn_out"), (2, "resid_mid"), (1, "attn_out")} <= refs
    # the MLA layer against llama.cpp: latent, the unrotated rope slices, probs, heads
    lc = {r["probe"] for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp"
          and r["status"] == "pass" and r["layer"] == 1}
    assert {"kv_latent", "q_pe", "k_pe", "q_absorbed", "attn_probs", "attn_heads", "attn_out"} <= lc


def test_mla_has_no_rope(policy):
    from harness.families import get

    fam = get(FAMILY)
    lc = fam.layer_configs(fam.make_config({}))[1]
    assert lc.rope is None and lc.q_lora_rank is None and "mla_rope" not in layer_features(lc)


@pytest.mark.parametrize("kv", ["decode", "paged"])
def test_naive_form_meets_hf(run, policy, kv):
    rows = run(policy, family=FAMILY, ref="hf", kv=kv, variant="naive")
    assert not [r for r in rows if r["status"] in ("fail", "error")]
    assert any(r["probe"] == "k_rope" and r["status"] == "pass" for r in rows)


def test_naive_form_against_llamacpp_is_an_error_that_says_why(run, policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref="llamacpp", variant="naive")
    err = [r for r in rows if r["status"] == "error"]
    assert len(err) == 1 and "segfault" in err[0]["reason"] and "compared with HF only" in err[0]["reason"]


def test_llamacpp_really_cannot_run_the_kv_b_file(gguf_export, need_llamacpp):
    """The reason above, measured: the file with attn_kv_b (and the _mla keys the
    loader requires) kills llama.cpp."""
    from harness.families import get
    from harness.references.llamacpp import capture as llamacpp

    fam = type(get(FAMILY))()
    fam.lc_naive_unsupported = None
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "naive")
    with pytest.raises(RuntimeError, match="signal|exit status"):
        llamacpp.run_worker(path, [[(1, 0, 0), (5, 1, 0)]], 1, {"l_out"})


def test_an_rms_eps_other_than_hf_s_fixed_one_is_two_findings_each_from_its_layer(run, policy, need_llamacpp):
    """rms_norm_eps = 1e-4: llama.cpp's KDA q/k L2 norm (kimi-linear.cpp 346-349) and MLA
    kv_a_layernorm (:408) take it, HF's fix 1e-6 (modeling_kimi_linear.py 431-432 / 489-490,
    235): each disagreement is named from the layer it starts at -- the KDA one from L0,
    the latent one at the MLA layer L1, never the latent one at L0 -- and without the KDA
    finding the KDA layers fail (measured: docs/measurements/2026-12-02-fuzz-gemma3n-hrm.md)."""
    from dataclasses import replace

    case = {"family": FAMILY, "ref": HF_AND_LLAMACPP, "tokens": 4, "overrides": (("rms_norm_eps", 1e-4),)}
    rows = run(policy, **case)
    assert not [r for r in rows if r["status"] in ("fail", "error")]
    why = {(r["candidate"], r["reference"], r["layer"], r["probe"]): r["reason"] for r in rows}
    for key in (("impl", "llamacpp", 0, "rec_out"), ("impl", "llamacpp", 2, "state_rec"),
                ("llamacpp", "hf", 0, "rec_out"), ("llamacpp", "hf", 1, "attn_heads")):
        assert "the KDA q/k L2 norm's epsilon" in why[key], key
    assert "the latent norm's epsilon" in why[("impl", "llamacpp", 1, "attn_heads")]
    # without the KDA finding (its captures cached: only the verdict runs again)
    kda = [f for f in policy.findings if f["reason"].startswith("the KDA q/k L2 norm's epsilon")]
    assert len(kda) == 2  # the statement and its seen_by
    bare = run(replace(policy, findings=[f for f in policy.findings if f not in kda]), **case)
    failing = {(r["candidate"], r["reference"], r["layer"], r["probe"]) for r in bare if r["status"] == "fail"}
    assert {("impl", "llamacpp", 0, "rec_out"), ("impl", "llamacpp", 2, "rec_out"),
            ("llamacpp", "hf", 0, "rec_out")} <= failing, failing
