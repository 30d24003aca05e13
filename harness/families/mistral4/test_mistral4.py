"""mistral4: DeepSeek V3's MLA with the query temperature, three-way in every KV
backing and against mlx-lm; the temperature and YaRN's two mscales are findings
against llama.cpp (its mistral4 file names no temperature, and its YaRN attention
factor special-cases deepseek2 only), where impl computes HF's model."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, bad_rows

FAMILY = "mistral4"
MLA_PROBES = ("q_latent", "kv_latent", "q_pe", "k_pe", "attn_probs", "attn_out")


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way_in_every_backing(run, policy, need_llamacpp, kv):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv=kv)
    assert not bad_rows(rows)
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        for layer in (0, 1, 2):
            for probe in MLA_PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
    assert st[("llamacpp", "hf", 2, "layer_out")] == "pass"  # the softmax router and its experts


TEMP = (("rope_parameters.original_max_position_embeddings", 8),)


def test_the_query_temperature_is_hfs_and_llamacpp_has_none(run, policy, need_llamacpp):
    """From position 8 (the original context here) HF scales the whole query by
    1 + 0.1 log(1 + floor(pos / 8)); impl does, at every probe against HF; llama.cpp's
    file names no temperature (conversion/mistral3.py Mistral4Model), the finding, from
    q_pe on. With the temperature on the rope slice only (a mutant) impl fails against HF."""
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv="decode", overrides=TEMP)
    assert not bad_rows(rows, ok=("pass", "not-exposed", "finding"))
    st = all_statuses(rows)
    for layer in (0, 1, 2):
        for probe in ("q_pe", "q_rope", "attn_probs", "attn_out"):
            assert st[("impl", "hf", layer, probe)] == "pass", (layer, probe)
    assert st[("impl", "llamacpp", 0, "q_pe")] == "finding" and st[("impl", "llamacpp", 0, "k_pe")] == "pass"
    lc = next(r for r in rows if (r["candidate"], r["reference"], r["layer"], r["probe"]) == ("llamacpp", "hf", 0, "q_pe"))
    assert lc["status"] == "finding" and "mistral4#1" in lc["reason"] and lc["nmse"] > 1e-4
    with applied(registry()["mla-temperature-on-the-rope-slice-only"]):
        planted = run(policy, family=FAMILY, ref="hf", kv="decode", overrides=TEMP)
    assert all_statuses(planted)[("impl", "hf", 0, "q_rope")] == "fail"


@pytest.mark.parametrize("mscale, mscale_all_dim, finding, first", [
    (2.0, 2.0, "mistral4#2", "q_pe"),  # DeepSeek V2's kind: right on deepseek2, not on mistral4
    (2.0, 1.0, "mistral4#2", "q_pe"),
    (1.0, 2.0, "mistral4#3", "attn_probs"),  # the rotation agrees, the softmax scale does not
])
def test_yarns_mscales_are_hfs_and_llamacpp_special_cases_deepseek2_only(run, policy, need_llamacpp, mscale,
                                                                        mscale_all_dim, finding, first):
    ov = (("rope_parameters.mscale", mscale), ("rope_parameters.mscale_all_dim", mscale_all_dim))
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv="decode", overrides=ov)
    assert not bad_rows(rows, ok=("pass", "not-exposed", "finding"))
    st = all_statuses(rows)
    assert all(st[("impl", "hf", layer, p)] == "pass" for layer in (0, 1, 2) for p in MLA_PROBES)
    assert st[("impl", "llamacpp", 0, first)] == "finding"
    named = [r["reason"] for r in rows if r["status"] == "finding" and r["candidate"] == "llamacpp"]
    assert named and all(finding in x for x in named)


def test_the_real_configs_yarn_is_three_way(run, policy, need_llamacpp):
    """Mistral Small 4's YaRN (mscale = mscale_all_dim = 1) at its factor 128 over an
    original context of 8192 positions: no finding, the temperature inert below 8192."""
    ov = (("rope_parameters.factor", 128.0), ("rope_parameters.original_max_position_embeddings", 8192),
          ("max_position_embeddings", 1048576))
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv="paged", overrides=ov)
    assert not bad_rows(rows)
    assert not [r for r in rows if r["status"] == "finding"]


def test_the_export_is_the_converters_mistral4_file(gguf_export, gguf_import, tmp_path):
    """conversion/mistral3.py Mistral4Model (a DeepseekV2Model): arch mistral4, the YaRN log
    multiplier 0.1 x mscale_all_dim, no temperature key and no gating key (softmax, the
    deepseek2 default) -- and it reads back as the model without the temperature."""
    from gguf import GGUFReader


    fam = get(FAMILY)
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, fam.variants[0])
    r = GGUFReader(str(path))
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "mistral4"
    assert float(r.fields["mistral4.rope.scaling.yarn_log_multiplier"].parts[-1][0]) == pytest.approx(0.1)
    for key in ("attention.temperature_scale", "attention.temperature_length", "expert_gating_func"):
        assert f"mistral4.{key}" not in r.fields, key
    back = gguf_import.load(str(path))
    assert back.family.name == FAMILY and back.config.rope_parameters["llama_4_scaling_beta"] == 0.0
    assert all(lc.temperature is None for lc in fam.layer_configs(back.config))
    assert all(lc.temperature is not None for lc in fam.layer_configs(config))


def test_plain_rope_is_refused_because_hf_fails_on_it():
    """HF's Mistral4RotaryEmbedding builds the default RoPE over the whole nope + rope head
    (ignoring partial_rotary_factor) and its forward fails on the rope slice: each HF
    reference refuses it (a one-line exit 2: tests/test_bad_input.py), the llama.cpp side
    does not, and the refusal is true -- HF's own forward raises."""
    import torch

    from harness import references

    fam = get(FAMILY)
    plain = fam.make_config({"rope_parameters.rope_type": "default"})
    for ref in ("hf", "hf_cached"):
        why = references.get(ref).config_refusal(fam, plain)
        assert why and "valid rope_type: yarn" in why and "\n" not in why
    assert fam.hf_refusal(fam.make_config({})) is None
    with pytest.raises(RuntimeError, match="size of tensor"):
        fam.build_model(plain, 0)(torch.zeros(1, 4, dtype=torch.long))


def test_mlx_runs_it(run, policy):
    rows = run(policy, family=FAMILY, ref="hf,mlx", kv="decode")
    assert not bad_rows(rows)
    st = all_statuses(rows)
    assert st[("impl", "mlx", 2, "attn_out")] == "pass" and st[("mlx", "hf", 2, "layer_out")] == "pass"


@pytest.mark.parametrize("tokens, excused", [(16, True), (8, False), (4, False)])
def test_the_temperature_finding_holds_only_past_the_original_context(policy, tokens, excused):
    """``tokens_over_key``: HF's factor is 1 below original_max_position_embeddings, so a
    case no longer than it has no temperature disagreement -- and the finding excuses
    nothing there (a YaRN or other llama.cpp disagreement of such a case is not hidden by it)."""
    fam = get(FAMILY)
    config = fam.make_config({"rope_parameters.original_max_position_embeddings": 8})
    why = policy.finding(FAMILY, "llamacpp", "hf", "q_pe", "mla", config, layer=0, nmse=1e-3, tokens=tokens, n_layers=3)
    assert (why is not None and "mistral4#1" in why) is excused, why
