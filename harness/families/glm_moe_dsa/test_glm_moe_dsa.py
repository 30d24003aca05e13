"""glm_moe_dsa specifics: the DSA indexer inert at the default config and active
(HF vs llama.cpp only) when index_topk is below the sequence length; the YaRN
setting both references share and the one only HF has; the naive form meets HF
only."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, bad_rows

FAMILY = "glm_moe_dsa"
YARN = (("rope_parameters.rope_type", "yarn"), ("rope_parameters.factor", 4.0),
        ("rope_parameters.original_max_position_embeddings", 128), ("rope_parameters.mscale_all_dim", 1.0))


def test_active_indexer_is_compared_between_references(assert_dsa_indexer_active, policy, need_llamacpp):
    """index_topk=8 at 16 tokens: HF and llama.cpp keep the same 8 keys per query from
    position 8 on; impl has no indexer (its MLA layers are not implemented here)."""
    assert_dsa_indexer_active(policy, FAMILY)


def test_default_indexer_is_inert(assert_dsa_indexer_inert, policy):
    assert_dsa_indexer_inert(policy, FAMILY)


def test_yarn_both_references(run, policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, overrides=YARN)
    assert not bad_rows(rows) and not [r for r in rows if r["status"] == "finding"]
    assert "mla_yarn" in rows[0]["features"]


def test_yarn_with_mscale_is_a_finding(run, policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, overrides=YARN + (("rope_parameters.mscale", 1.0),))
    assert not bad_rows(rows)
    assert all(r["status"] in ("pass", "not-exposed") for r in rows if r["reference"] == "hf" and r["candidate"] == "impl")
    assert ("impl", "llamacpp", 0, "q_pe") in {(r["candidate"], r["reference"], r["layer"], r["probe"])
                                               for r in rows if r["status"] == "finding"}


@pytest.mark.parametrize("kv", ["batched", "paged"])
def test_naive_form_meets_hf(run, policy, kv):
    rows = run(policy, family=FAMILY, ref="hf", kv=kv, variant="naive")
    assert not bad_rows(rows) and any(r["probe"] == "k_rope" and r["status"] == "pass" for r in rows)


def test_llamacpp_refuses_the_kv_b_file(gguf_export, need_llamacpp):
    from harness.families import get
    from harness.references.llamacpp import capture as llamacpp

    fam = type(get(FAMILY))()
    fam.lc_naive_unsupported = None
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "naive")
    with pytest.raises(RuntimeError, match="could not load|exit status|signal"):
        llamacpp.run_worker(path, [[(1, 0, 0)]], 1, {"l_out"})
