"""mamba2: the Mamba-2 layers judged probe by probe against HF's full forward, HF's
cached path and llama.cpp, their conv and SSM states at every call boundary (llama.cpp
names only attn_norm, mamba2_y_add_d, mamba_out and l_out inside the layer: the rest is
not-exposed with the reason); planted bugs in the D skip, the dt softplus and the
grouped output norm fail where they act, against every reference that sees them."""

from __future__ import annotations

import pytest

from harness.kinds.mutant import Mutant
from harness.mutants import applied
from harness.testing import HF_AND_LLAMACPP, all_statuses

HF_PROBES = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
             "attn_branch", "attn_out", "resid_mid")
LC_NAMED = ("attn_in", "rec_out", "attn_out", "resid_mid", "state_conv", "state_rec")
LC_UNNAMED = ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "attn_branch")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule", [("batched", "5,1,10"), ("paged", "mixed")])
def test_mamba2_three_way_with_its_states(run, policy, kv, schedule):
    rows = run(policy, family="mamba2", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    for layer in (0, 1):
        assert {r["layer_kind"] for r in rows if r["layer"] == layer and r["candidate"] == "impl"} == {"mamba2"}
        for ref in ("hf", "hf_cached"):
            for probe in HF_PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        for probe in ("state_conv", "state_rec"):
            assert st[("impl", "hf_cached", layer, probe)] == "pass"
            assert st[("llamacpp", "hf_cached", layer, probe)] == "pass"
            assert st[("impl", "hf", layer, probe)] == "not-exposed"
        for probe in LC_NAMED:
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        unnamed = [r for r in rows if r["candidate"] == "impl" and r["reference"] == "llamacpp"
                   and r["layer"] == layer and r["probe"] in LC_UNNAMED]
        assert {r["probe"] for r in unnamed} == set(LC_UNNAMED)
        assert all(r["status"] == "not-exposed" and "build_mamba2_layer" in r["reason"] for r in unnamed)
    for probe in ("rec_out", "attn_out", "layer_out"):
        assert st[("llamacpp", "hf", 1, probe)] == "pass", probe
    assert [r["status"] for r in rows if r["candidate"] == "llamacpp" and r["reference"] == "hf"
            and r["probe"] == "logits"] == ["pass"]


# planted bugs, applied for one run each (not registered: the mutation matrix is the kinds' own)
D_SKIP = Mutant("mamba2-d-skip-dropped", "d_skip", "impl.recurrent",
                "y = y + xp.astype(v, acc, copy=False) * skip", "y = y")
DT_RAW = Mutant("mamba2-dt-not-softplus", "dt_softplus", "impl.recurrent",
                'dt = _softplus(xp, f(dt_raw) + f(w["dt_bias"]))', 'dt = f(dt_raw) + f(w["dt_bias"])')
ONE_GROUP = Mutant("mamba2-norm-one-group", "out_norm_groups", "impl.recurrent",
                   "yg = yg / xp.sqrt(xp.mean(yg * yg, axis=-1, keepdims=True) + cfg.out_norm_eps)",
                   "yg = yg / xp.sqrt(xp.mean(yg * yg, axis=(-2, -1), keepdims=True) + cfg.out_norm_eps)")


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("m,hf_first,lc_first", [(D_SKIP, "rec_out", "rec_out"), (DT_RAW, "rec_decay", "rec_out"),
                                                 (ONE_GROUP, "attn_branch", "attn_out")])
def test_planted_bugs_fail_where_they_act(run, policy, m, hf_first, lc_first):
    with applied(m):
        st = all_statuses(run(policy, family="mamba2", ref=HF_AND_LLAMACPP, schedule="5,1,10"))
    for ref in ("hf", "hf_cached"):
        assert st[("impl", ref, 0, hf_first)] == "fail", (m.name, ref)
        assert st[("impl", ref, 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, lc_first)] == "fail", m.name
    assert st[("llamacpp", "hf", 0, "attn_out")] == "pass"  # the references still agree


@pytest.mark.usefixtures("need_llamacpp")
def test_export_without_neg_exp_a_log_is_caught(run, policy, monkeypatch, tmp_path):
    """The converter's A_log -> -exp(A_log) is what makes llama.cpp's decay agree:
    written raw, llama.cpp's first SSM output leaves HF's. (A cache of its own: the
    capture cache keys on the family's source files, which the patch leaves alone.)"""
    from harness.families import get

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    fam = get("mamba2")
    monkeypatch.setattr(type(fam), "gguf_value_map", lambda self, name, data, config: data)
    st = all_statuses(run(policy, family="mamba2", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "rec_out")] == "fail"
