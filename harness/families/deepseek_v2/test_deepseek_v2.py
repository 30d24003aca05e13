"""deepseek_v2 specifics: the naive form against llama.cpp's legacy (kv_b) graph
in every KV mode, the HF-only YaRN setting reported as a finding, direct Q."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, bad_rows

FAMILY = "deepseek_v2"


def _passed(rows, cand="impl", ref="llamacpp"):
    return {(r["layer"], r["probe"]) for r in rows
            if r["candidate"] == cand and r["reference"] == ref and r["status"] == "pass"}


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_naive_form_meets_both_references(run, policy, need_llamacpp, kv):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv=kv, variant="naive")
    assert not bad_rows(rows)
    assert {r["variant"] for r in rows} == {"naive"}
    lc = _passed(rows)
    # llama.cpp ran its naive (!is_mla) graph: per-head K and the RoPE'd Qcur exist ...
    assert {(i, p) for i in range(3) for p in ("k_rope", "q_rope", "attn_probs", "attn_heads", "kv_latent")} <= lc
    # ... and no absorbed query
    assert not any(p == "q_absorbed" for _, p in lc)


def test_absorbed_form_meets_llamacpp_in_latent_space(run, policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv="paged")
    assert not bad_rows(rows)
    lc = _passed(rows)
    assert {(i, p) for i in range(3) for p in ("q_absorbed", "q_pe", "k_pe", "q_latent", "attn_probs")} <= lc
    assert not any(p == "k_rope" for _, p in lc)  # the absorbed graph has no per-head key


def test_yarn_mscale_unequal_is_a_finding(run, policy, need_llamacpp):
    """HF-only: mscale != mscale_all_dim. impl follows HF; llama.cpp's deepseek2
    rotates with magnitude 1 -- a known disagreement, reported as such."""
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, overrides=(("rope_parameters.mscale", 1.0),))
    assert not bad_rows(rows)
    hf = [r for r in rows if r["candidate"] == "impl" and r["reference"] == "hf"]
    assert hf and all(r["status"] in ("pass", "not-exposed") for r in hf)
    findings = {(r["candidate"], r["reference"], r["layer"], r["probe"]) for r in rows if r["status"] == "finding"}
    assert ("impl", "llamacpp", 0, "q_pe") in findings and ("llamacpp", "hf", -1, "logits") in findings
    # the part of the layer before RoPE still agrees with llama.cpp
    assert {(0, "q"), (0, "kv_latent")} <= _passed(rows)


@pytest.mark.parametrize("variant", ["absorbed", "naive"])
def test_direct_q(run, policy, need_llamacpp, variant):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, variant=variant, overrides=(("q_lora_rank", None),))
    assert not bad_rows(rows)
    assert (0, "q") in _passed(rows) and not any(r["probe"] == "q_latent" for r in rows if r["candidate"] == "impl")


def test_direct_q_file_without_q_lora_rank_is_refused(gguf_export, need_llamacpp):
    """Why the export writes `deepseek2.attention.q_lora_rank = 0`: the converter's
    file (no key) does not load (deepseek2.cpp load_arch_hparams requires it)."""
    from harness.families import get
    from harness.references.llamacpp import capture as llamacpp

    fam = type(get(FAMILY))()
    fam.direct_q_rank_key = False
    config = fam.make_config({"q_lora_rank": None})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "absorbed")
    with pytest.raises(RuntimeError, match="could not load|exit status"):
        llamacpp.run_worker(path, [[(1, 0, 0)]], 1, {"l_out"})
