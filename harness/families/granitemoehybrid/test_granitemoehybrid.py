"""granitemoehybrid: the Mamba-2 layers and the NoPE attention layer judged probe by
probe against HF's full forward, HF's cached path and llama.cpp (granitehybrid),
the Mamba layers' conv and SSM states at every call boundary, the attention layer's
KV through decode, batched and paged; planted bugs in the Mamba branch's residual
multiplier, the D skip and the attention's residual multiplier fail where they act,
against every reference that sees them."""

from __future__ import annotations

import pytest

from harness.kinds.mutant import Mutant
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

REC = (0, 2)
HF_REC_PROBES = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
                 "attn_branch", "attn_out", "resid_mid")
LC_REC_NAMED = ("attn_in", "rec_out", "attn_out", "resid_mid", "state_conv", "state_rec")
ATTN_PROBES = ("q", "k", "v", "attn_probs", "attn_heads", "attn_branch", "attn_out", "resid_mid")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented", "finding")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule", [("batched", "5,1,10"), ("paged", "mixed")])
def test_three_way_with_states_and_kv(run, policy, kv, schedule):
    rows = run(policy, family="granitemoehybrid", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    assert {r["layer_kind"] for r in rows if r["layer"] == 1 and r["candidate"] == "impl"} == {"attention"}
    for layer in REC:
        assert {r["layer_kind"] for r in rows if r["layer"] == layer and r["candidate"] == "impl"} == {"mamba2"}
        for ref in ("hf", "hf_cached"):
            for probe in HF_REC_PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        for probe in ("state_conv", "state_rec"):
            assert st[("impl", "hf_cached", layer, probe)] == "pass"
            assert st[("llamacpp", "hf_cached", layer, probe)] == "pass"
        for probe in LC_REC_NAMED:
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
    for ref in ("hf", "hf_cached", "llamacpp"):
        for probe in ATTN_PROBES:
            assert st[("impl", ref, 1, probe)] == "pass", (ref, probe)
    # NoPE: llama.cpp builds no RoPE node (the converter writes rope.scaling.finetuned=false)
    assert st[("impl", "llamacpp", 1, "q_rope")] == "not-exposed"
    for probe in ("embeddings", "layer_out", "logits"):
        key = ("llamacpp", "hf", -1 if probe in ("embeddings", "logits") else 2, probe)
        assert st[key] == "pass", key


# planted bugs, applied for one run each
REC_RESID = Mutant("mamba2-residual-multiplier-dropped", "residual_beta", "impl.recurrent",
                   "resid = base + (out * cfg.residual_beta if cfg.residual_beta != 1.0 else out)",
                   "resid = base + out")
D_SKIP = Mutant("mamba2-d-skip-dropped", "d_skip", "impl.recurrent",
                "y = y + xp.astype(v, acc, copy=False) * skip", "y = y")


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("m,layer,first,before", [
    (REC_RESID, 0, "resid_mid", "attn_out"),
    (D_SKIP, 0, "rec_out", "attn_in"),
    (registry()["residual-multiplier-dropped"], 1, "resid_mid", "attn_out"),
])
def test_planted_bugs_fail_where_they_act(run, policy, m, layer, first, before):
    with applied(m):
        st = all_statuses(run(policy, family="granitemoehybrid", ref=HF_AND_LLAMACPP, schedule="5,1,10"))
    for ref in ("hf", "hf_cached", "llamacpp"):
        assert st[("impl", ref, layer, first)] == "fail", (m.name, ref)
        assert st[("impl", ref, layer, before)] == "pass", (m.name, ref)
    assert st[("llamacpp", "hf", 2, "layer_out")] == "pass"  # the references still agree


def test_rope_is_refused_for_llamacpp_only():
    from harness.families import get

    fam = get("granitemoehybrid")
    config = fam.make_config({"position_embedding_type": "rope"})
    why = fam.lc_refusal(config)
    assert why and "use_rope" in why and "position_embedding_type" in why
    assert fam.hf_refusal(config) is None
    assert fam.lc_refusal(fam.make_config({})) is None


def test_no_mamba_layer_is_refused_by_llamacpp_with_the_converters_line(run, policy):
    """All-attention layer_types: the converter writes arch granitemoe, not granitehybrid,
    and llama.cpp's worker aborted on the granitehybrid file (GGML_ASSERT(buffer)) -- an
    error row. Now llama.cpp is not-implemented with those lines; HF and its cached path
    judge impl, which passes; a hybrid config stays three-way."""
    from harness.families import get

    fam = get("granitemoehybrid")
    only_attn = (("layer_types", ["attention"] * 3),)
    rows = run(policy, family="granitemoehybrid", ref=HF_AND_LLAMACPP, overrides=only_attn)
    lc = [r for r in rows if r["reference"] == "llamacpp" or r["candidate"] == "llamacpp"]
    assert [r["status"] for r in lc] == ["not-implemented"], lc
    assert "conversion/granite.py" in lc[0]["reason"] and "GGML_ASSERT(buffer)" in lc[0]["reason"]
    assert {r["status"] for r in rows if r["candidate"] == "impl"} <= {"pass", "not-exposed", "not-implemented"}
    assert any(r["status"] == "pass" and r["reference"] == "hf" for r in rows)
    assert fam.gguf_export_refusal(fam.make_config()) is None
