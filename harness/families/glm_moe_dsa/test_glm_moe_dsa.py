"""glm_moe_dsa specifics: the DSA indexer inert at the default config and active
(HF vs llama.cpp only) when index_topk is below the sequence length; the YaRN
setting both references share and the one only HF has; the naive form meets HF
only."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import bad_rows, case_run, run

FAMILY = "glm_moe_dsa"
YARN = (("rope_parameters.rope_type", "yarn"), ("rope_parameters.factor", 4.0),
        ("rope_parameters.original_max_position_embeddings", 128), ("rope_parameters.mscale_all_dim", 1.0))


def test_active_indexer_is_compared_between_references(policy, need_llamacpp):
    """index_topk=8 at 16 tokens: from position 8 on each query keeps 8 keys. impl has
    no indexer, so its MLA layers are not implemented here; HF and llama.cpp agree."""
    rows = run(policy, family=FAMILY, ref="all", overrides=(("index_topk", 8),))
    assert not bad_rows(rows)
    assert {r["layer_kind"] for r in rows if r["status"] == "not-implemented"} == {"mla_dsa"}
    assert {(0, "attn_probs"), (2, "attn_probs"), (-1, "logits")} <= {
        (r["layer"], r["probe"]) for r in rows if r["candidate"] == "llamacpp" and r["status"] == "pass"}
    # the indexer really dropped keys in HF's probabilities (what both references computed)
    cr = case_run(policy, FAMILY, overrides=(("index_topk", 8),))
    probs = cr.capture("hf").probes["L1.attn_probs"][0]  # [H, T, T]
    kept = (probs > 0).sum(-1)
    assert (kept[:, :8] == np.arange(1, 9)).all() and (kept[:, 8:] == 8).all()


def test_default_indexer_is_inert(policy):
    cr = case_run(policy, FAMILY)
    probs = cr.capture("hf").probes["L1.attn_probs"][0]
    assert ((probs > 0).sum(-1) == np.arange(1, 17)).all()


def test_yarn_both_references(policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref="all", overrides=YARN)
    assert not bad_rows(rows) and not [r for r in rows if r["status"] == "finding"]
    assert "mla_yarn" in rows[0]["features"]


def test_yarn_with_mscale_is_a_finding(policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref="all", overrides=YARN + (("rope_parameters.mscale", 1.0),))
    assert not bad_rows(rows)
    assert all(r["status"] in ("pass", "not-exposed") for r in rows if r["reference"] == "hf" and r["candidate"] == "impl")
    assert ("impl", "llamacpp", 0, "q_pe") in {(r["candidate"], r["reference"], r["layer"], r["probe"])
                                               for r in rows if r["status"] == "finding"}


@pytest.mark.parametrize("kv", ["batched", "paged"])
def test_naive_form_meets_hf(policy, kv):
    rows = run(policy, family=FAMILY, ref="hf", kv=kv, variant="naive")
    assert not bad_rows(rows) and any(r["probe"] == "k_rope" and r["status"] == "pass" for r in rows)


def test_llamacpp_refuses_the_kv_b_file(need_llamacpp):
    from harness.families import get
    from harness.gguf import export as gguf_export
    from harness.references.llamacpp import capture as llamacpp

    fam = type(get(FAMILY))()
    fam.lc_naive_unsupported = None
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "naive")
    with pytest.raises(RuntimeError, match="could not load|exit status|signal"):
        llamacpp.run_worker(path, [[(1, 0, 0)]], 1, {"l_out"})
