"""deepseek_v32 specifics: three-way in every KV mode with the real V3.2 YaRN
setting (which deepseek32.cpp, unlike glm-dsa.cpp, computes as HF does); a
planted YaRN bug in impl fails against both references; the DSA indexer inert at
the default config and active (HF vs llama.cpp only) below the sequence length;
the naive form meets HF only; the required gating key."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, bad_rows

FAMILY = "deepseek_v32"


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way_with_yarn(run, policy, need_llamacpp, kv):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv=kv)
    assert not bad_rows(rows) and not [r for r in rows if r["status"] == "finding"]
    assert {"mla_yarn", "mla_absorbed", "mla_low_rank_q"} <= set(rows[0]["features"].split(";"))
    st = all_statuses(rows)
    for ref in ("hf", "hf_cached", "llamacpp"):
        for layer in range(3):
            for probe in ("q_pe", "k_pe", "attn_probs", "attn_heads", "attn_out"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
    assert st[("llamacpp", "hf", -1, "logits")] == "pass"


# (not mla-yarn-magnitude-missing: at mscale == mscale_all_dim the rotated channels'
# magnitude is get_mscale(f, 1) / get_mscale(f, 1) = 1, so dropping it changes nothing)
@pytest.mark.parametrize("name,probe", [("mla-yarn-bands-missing", "q_pe"),
                                        ("mla-kq-scale-without-mscale", "attn_probs")])
def test_a_broken_yarn_fails_against_both_references(run, policy, need_llamacpp, name, probe):
    """deepseek32.cpp reads the YaRN log multiplier: a YaRN bug in impl fails
    against llama.cpp as it does against HF, at the probe it acts on."""
    with applied(registry()[name]):
        st = all_statuses(run(policy, family=FAMILY, ref=HF_AND_LLAMACPP))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "kv_latent")] == "pass", (name, ref)
        assert st[("impl", ref, 0, probe)] == "fail", (name, ref)


def test_active_indexer_is_compared_between_references(assert_dsa_indexer_active, policy, need_llamacpp):
    """index_topk=8 at 16 tokens: HF and llama.cpp keep the same 8 keys per query from
    position 8 on; impl has no indexer (its MLA layers are not implemented here)."""
    assert_dsa_indexer_active(policy, FAMILY)


def test_default_indexer_is_inert(assert_dsa_indexer_inert, policy):
    assert_dsa_indexer_inert(policy, FAMILY)


@pytest.mark.parametrize("kv", ["batched", "paged"])
def test_naive_form_meets_hf(run, policy, kv):
    rows = run(policy, family=FAMILY, ref="hf", kv=kv, variant="naive")
    assert not bad_rows(rows) and any(r["probe"] == "k_rope" and r["status"] == "pass" for r in rows)


def test_gating_key_is_written_and_required(gguf_export, need_llamacpp):
    """deepseek32.cpp load_arch_hparams reads expert_gating_func as a required key;
    the converter writes it only from config.json's scoring_func (the tiny config
    keeps it as an extra key). Without it llama.cpp refuses the file."""
    import gguf as gg

    from harness.families import get
    from harness.references.llamacpp import capture as llamacpp

    fam = get(FAMILY)
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "absorbed")
    r = gg.GGUFReader(str(path))
    assert int(r.fields["deepseek32.expert_gating_func"].parts[-1][0]) == 2
    config = fam.make_config({"scoring_func": None})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "absorbed")
    with pytest.raises(RuntimeError, match="could not load|exit status|signal"):
        llamacpp.run_worker(path, [[(1, 0, 0)]], 1, {"l_out"})


def test_yarn_mscale_below_one_is_a_finding(run, policy, need_llamacpp):
    """mscale = mscale_all_dim = 0.707: HF's rope magnitude stays 1, llama.cpp's
    deepseek32 assumes mscale = 1 (llama-context.cpp special-cases deepseek2 only):
    a bounded finding from L0 q_pe on; impl (HF's model) passes against HF."""
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, overrides=(("rope_parameters.mscale_all_dim", 0.707),
                                                            ("rope_parameters.mscale", 0.707)))
    assert not bad_rows(rows)
    assert all(r["status"] in ("pass", "not-exposed") for r in rows if r["reference"] == "hf" and r["candidate"] == "impl")
    found = {(r["candidate"], r["reference"], r["layer"], r["probe"]) for r in rows if r["status"] == "finding"}
    assert {("impl", "llamacpp", 0, "q_pe"), ("llamacpp", "hf", 0, "q_pe"), ("llamacpp", "hf", -1, "logits")} <= found
    assert ("impl", "llamacpp", 0, "kv_latent") not in found
