"""nemotron_h: the Mamba-2, attention and MLP-only layers of one pattern judged probe by
probe against HF's full forward, HF's cached path and llama.cpp (the Mamba-2 states at
every call boundary; the MLP layer's absent attention half by its residual); planted
bugs in the D skip, the NoPE attention, the absent layer's residual and the dt floor
fail where they act; the dt floor HF's one-row update skips is a bounded finding."""

from __future__ import annotations

import pytest

from harness.kinds.mutant import Mutant
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

MAMBA, ATTN, MLP = (0, 3), 1, 2
HF_REC = ("attn_in", "rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
          "attn_branch", "attn_out", "resid_mid")
LC_REC = ("attn_in", "rec_out", "attn_out", "resid_mid", "state_conv", "state_rec")
ATTN_PROBES = ("attn_in", "q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out",
               "resid_mid")


def _bad(rows):
    return [r for r in rows if r["status"] in ("fail", "error", "unguarded", "missing", "not-implemented")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("kv,schedule", [("batched", "5,1,10"), ("paged", "mixed")])
def test_nemotron_h_three_way_by_layer_kind(run, policy, kv, schedule):
    rows = run(policy, family="nemotron_h", ref=HF_AND_LLAMACPP, kv=kv, schedule=schedule)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    kinds = {r["layer"]: r["layer_kind"] for r in rows if r["candidate"] == "impl" and r["layer"] != "-"}
    assert kinds == {0: "mamba2", 1: "attention", 2: "absent", 3: "mamba2"}, kinds
    for layer in MAMBA:
        for ref in ("hf", "hf_cached"):
            for probe in HF_REC:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        for probe in LC_REC:
            assert st[("impl", "llamacpp", layer, probe)] == "pass", (layer, probe)
        for probe in ("state_conv", "state_rec"):
            assert st[("impl", "hf_cached", layer, probe)] == "pass"
            assert st[("llamacpp", "hf_cached", layer, probe)] == "pass"
    # the RoPE-free attention layer: Q / K as they enter the scores (llama.cpp's unpermuted)
    for ref in ("hf", "hf_cached", "llamacpp"):
        for probe in ATTN_PROBES:
            assert st[("impl", ref, ATTN, probe)] == "pass", (ref, probe)
        # the MLP layer: no attention half, the residual is the block's input
        assert st[("impl", ref, MLP, "resid_mid")] == "pass", ref
    # the MLP itself (relu2) only the references see: llama.cpp's block output after it
    for probe in ("layer_out",):
        assert st[("llamacpp", "hf", MLP, probe)] == "pass"
    assert [r["status"] for r in rows if r["candidate"] == "llamacpp" and r["reference"] == "hf"
            and r["probe"] == "logits"] == ["pass"]


# planted bugs, applied for one run each (not registered: the mutation matrix is the kinds' own)
D_SKIP = Mutant("nemotron-h-d-skip-dropped", "d_skip", "impl.recurrent",
                "y = y + xp.astype(v, acc, copy=False) * skip", "y = y")
DT_FLOOR_DROPPED = Mutant("mamba2-dt-limit-dropped", "dt_limit", "impl.recurrent",
                          "dt = xp.clip(dt, cfg.dt_limit[0], cfg.dt_limit[1])", "dt = dt")


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("m,layer,first,before", [
    (D_SKIP, 0, "rec_out", (0, "attn_in")),
    (registry()["absent-layer-adds-its-input"], MLP, "resid_mid", (ATTN, "attn_out")),
    (registry()["nope-layer-rotated"], ATTN, "q_rope", (ATTN, "v"))])
def test_planted_bugs_fail_where_they_act(run, policy, m, layer, first, before):
    with applied(m):
        st = all_statuses(run(policy, family="nemotron_h", ref=HF_AND_LLAMACPP, schedule="5,1,10"))
    for ref in ("hf", "hf_cached", "llamacpp"):
        # against HF's full forward a plain fail; against the cached path and llama.cpp a Mamba
        # layer's rows may fall inside the dt-floor finding's bound (findings.toml: it holds at
        # the default time_step_min, on the Mamba layers), where HF's failing row leaves it
        # unguarded -- failing too
        want = ("fail",) if ref == "hf" or layer not in MAMBA else ("fail", "unguarded")
        assert st[("impl", ref, layer, first)] in want, (m.name, ref, st[("impl", ref, layer, first)])
        assert st[("impl", ref, *before)] == "pass", (m.name, ref)  # what comes before it still agrees
    assert st[("llamacpp", "hf", layer, "layer_out")] == "pass"  # the references still agree


@pytest.mark.usefixtures("need_llamacpp")
def test_the_dt_floor_is_hfs_chunked_scan_and_a_bounded_finding_elsewhere(run, policy):
    """NemotronHMamba2Mixer clamps dt at (time_step_min, inf) in its chunked scan only
    (modeling_nemotron_h.py mamba2_chunk_scan's dt_limit; mamba2_selective_state_update
    takes none) and llama.cpp never (ggml ssm_scan: softplus only). At time_step_min=0.5
    (the floor acts on a good share of the tiny model's dt): impl, which clamps as HF's
    full forward does, passes against it; against HF's cached path and llama.cpp the
    difference is the finding, guarded by HF's passing rows -- and without impl's clamp
    the comparison against HF's full forward fails at the decay."""
    case = dict(family="nemotron_h", ref=HF_AND_LLAMACPP, schedule="5,1,10", overrides=(("time_step_min", 0.5),))
    rows = run(policy, **case)
    assert not _bad(rows), _bad(rows)[:3]
    st = all_statuses(rows)
    for layer in MAMBA:
        assert st[("impl", "hf", layer, "rec_decay")] == "pass"
        assert st[("impl", "hf", layer, "rec_out")] == "pass"
        assert st[("impl", "llamacpp", layer, "rec_out")] == "finding"
        assert st[("impl", "hf_cached", layer, "rec_out")] == "finding"
    assert st[("llamacpp", "hf", 3, "layer_out")] == "finding"
    with applied(DT_FLOOR_DROPPED):
        st = all_statuses(run(policy, **case))
    assert st[("impl", "hf", 0, "rec_decay")] == "fail"
    assert st[("impl", "hf", 0, "rec_conv")] == "pass"
