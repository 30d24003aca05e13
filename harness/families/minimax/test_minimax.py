"""minimax: the lightning layers judged probe by probe against HF's full forward,
HF's cached path and llama.cpp, their state at every call boundary; the
softmax-attention layer 7 with its residual from the normed input x alpha; HF's
cached path losing the positions after a lightning layer 0 (a bounded finding,
absent where layer 0 is softmax attention); planted bugs in the slopes and the
residual fail where they act."""

from __future__ import annotations

import re

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses, bad_rows

LIGHTNING = range(7)  # the tiny config: layers 0-6 lightning, 7 softmax attention
REC_PROBES = ("attn_in", "rec_z", "rec_q", "rec_k", "rec_v", "rec_out", "attn_out", "resid_mid")
BAD = ("fail", "error", "unguarded", "missing", "not-implemented")


@pytest.mark.usefixtures("need_llamacpp")
def test_lightning_layers_three_way_with_their_states(run, policy):
    rows = run(policy, family="minimax", ref=HF_AND_LLAMACPP, kv="paged", schedule="mixed")
    assert not [r for r in rows if r["status"] in BAD]
    st = all_statuses(rows)
    for layer in LIGHTNING:
        assert {r["layer_kind"] for r in rows if r["layer"] == layer} == {"lightning"}
        for ref in ("hf", "hf_cached", "llamacpp"):
            for probe in REC_PROBES:
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
        for probe in ("rec_decay", "attn_branch"):  # HF's own slope buffer; out_proj's input
            assert st[("impl", "hf", layer, probe)] == "pass"
            # minimax-01.cpp: slope_rate is per layer ([n_head]); the gated row is unnamed
            assert st[("impl", "llamacpp", layer, probe)] == "not-exposed"
        assert st[("impl", "hf_cached", layer, "state_rec")] == "pass"
        assert st[("impl", "llamacpp", layer, "state_rec")] == "pass"
        assert st[("llamacpp", "hf_cached", layer, "state_rec")] == "pass"
        assert st[("impl", "hf", layer, "state_rec")] == "not-exposed"
        # the lightning layers before the attention layer agree in HF's cached path
        assert st[("hf_cached", "hf", layer, "rec_out")] == "pass"
    # the softmax-attention layer: against HF's forward and llama.cpp it passes ...
    for ref in ("hf", "llamacpp"):
        for probe in ("q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_out", "resid_mid"):
            assert st[("impl", ref, 7, probe)] == "pass", (ref, probe)
    assert st[("llamacpp", "hf", 7, "attn_probs")] == "pass"
    # ... and HF's cached path restarts its positions at 0 after each call (the finding):
    # its q / k / v still agree, everything from q_rope on is the finding's
    assert st[("impl", "hf_cached", 7, "q")] == "pass"
    for probe in ("q_rope", "attn_probs", "resid_mid"):
        assert st[("impl", "hf_cached", 7, probe)] == "finding", probe
        assert st[("hf_cached", "hf", 7, probe)] == "finding", probe
        assert st[("llamacpp", "hf_cached", 7, probe)] == "finding", probe
    excused = {m for r in rows if r["status"] == "finding" for m in re.findall(r"finding (\w+#\d+)", r["reason"])}
    assert excused <= {"minimax#1", "minimax#2"}, excused


def test_hf_cached_positions_are_right_when_layer_0_is_attention(run, policy):
    """The finding's condition is the cause: with layer 0 softmax attention (HF-only: the
    file cannot carry that layout) HF's cache counts the rows, and its cached path agrees
    with its forward on every probe -- on a multi-row call after the first too, which it
    then runs (not refused: hf_cached_schedule_refusal's other side). Also HF-only: betas != 1 and
    unequal alphas."""
    types = ["full_attention"] + ["linear_attention"] * 6 + ["full_attention"]
    rows = run(policy, family="minimax", ref="hf_cached", kv="batched", schedule="5,1,1,9",
               overrides=(("layer_types", types), ("linear_attn_beta_factor", 0.75), ("mlp_alpha_factor", 1.25)))
    assert not [r for r in rows if r["status"] in BAD + ("finding",)]
    st = all_statuses(rows)
    for layer in (0, 7):
        for probe in ("q_rope", "attn_probs", "attn_heads", "resid_mid"):
            assert st[("impl", "hf_cached", layer, probe)] == "pass", (layer, probe)
    assert st[("impl", "hf_cached", 3, "state_rec")] == "pass"
    feats = set(rows[0]["features"].split(";"))
    assert {"lightning", "normed_residual"} <= feats


def test_hf_cached_sits_out_a_schedule_it_crashes_on(cli_main, run, policy):
    """HF's cached path crashes on a multi-row call after the first when layer 0 is a
    lightning layer and a softmax layer follows (modeling_minimax.py:663 / :679 / :382;
    every such schedule crashed on transformers 5.24, and none other did:
    docs/measurements/2026-12-02-recurrent-grid.md). Named alone it is refused in one
    line (exit 2); under --ref all it sits out in one skipped row naming HF's lines, and
    the others judge the case -- never an error row, never a pass."""
    from harness.families import get

    fam = get("minimax")
    cfg = fam.make_config({})
    for chunks in ((5, 1, 1, 9), (1, 2), (1, 1, 3), (3, 3)):
        why = fam.hf_cached_schedule_refusal(cfg, chunks)
        assert why and "modeling_minimax.py:663" in why and "\n" not in why, chunks
    for chunks in ((16,), (1,) * 16, (8,) + (1,) * 8, (5, 1, 1)):  # a later call of one row runs
        assert fam.hf_cached_schedule_refusal(cfg, chunks) is None, chunks
    from harness import references

    assert references.get("hf_cached").schedule_refusal(fam, cfg, (5, 1, 1, 9))  # the reference asks the family
    for ref in ("hf", "llamacpp"):
        assert references.get(ref).schedule_refusal(fam, cfg, (5, 1, 1, 9)) is None
    lin, full = "linear_attention", "full_attention"
    for types in ([full] + [lin] * 6 + [full], [lin] * 8):  # layer 0 attention; no attention layer
        assert fam.hf_cached_schedule_refusal(fam.make_config({"layer_types": types}), (5, 1, 1, 9)) is None
    assert cli_main(["run", "--family", "minimax", "--ref", "hf_cached", "--schedule", "5,1,1,9"]) == 2

    rows = run(policy, family="minimax", ref=HF_AND_LLAMACPP, tokens=6, schedule="2,2,2")
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["reference"] == "hf_cached", skipped
    assert "modeling_minimax.py:663" in skipped[0]["reason"]
    assert not [r for r in rows if r["status"] in BAD] and not [r for r in rows if "hf_cached" in
                                                                (r["candidate"], r["reference"]) and r is not skipped[0]]
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):  # the others judge every layer
        for layer in range(8):
            assert st[("impl", ref, layer, "attn_out")] == "pass", (ref, layer)


def test_llamacpp_refuses_what_the_converter_cannot_write():
    """What the converter cannot write is refused for llama.cpp in one line (exit 2 before
    any work, harness/budget.py), and only for it: a beta other than 1, unequal alphas
    (MiniMaxText01Model.set_gguf_parameters asserts both), a layout other than every 8th
    layer softmax attention (minimax-01.cpp's default interval)."""
    from harness.families import get

    fam = get("minimax")
    assert fam.lc_refusal(fam.make_config({})) is None
    types = ["full_attention"] + ["linear_attention"] * 6 + ["full_attention"]
    for kw, word in (({"full_attn_beta_factor": 0.5}, "betas"), ({"mlp_alpha_factor": 2.0}, "alphas"),
                     ({"layer_types": types}, "every 8th")):
        why = fam.lc_refusal(fam.make_config(kw))
        assert why and word in why and "\n" not in why, (kw, why)
        assert fam.hf_refusal(fam.make_config(kw)) is None


@pytest.mark.usefixtures("need_llamacpp")
def test_reversed_slopes_fail_at_the_decay_and_the_state(run, policy):
    """The planted bug: lightning's per-head slopes in reverse head order. Against HF's
    forward the decay itself differs (rec_decay, from HF's slope buffer) while q / k / v
    still pass; y differs against HF, and against the two references that run the calls
    (HF's cached path, llama.cpp) layer 0 fails too."""
    m = registry()["lightning-slopes-reversed"]
    case = dict(family="minimax", kv="paged", schedule="mixed")
    with applied(m):
        rows = run(policy, ref=HF_AND_LLAMACPP, **case)
    st = all_statuses(rows)
    assert st[("impl", "hf", 0, "rec_decay")] == "fail"
    assert st[("impl", "hf", 0, "rec_q")] == "pass"
    assert st[("impl", "hf", 0, "rec_out")] == "fail"
    # the references that run the calls (the clean case passes every probe against them)
    for ref in ("hf_cached", "llamacpp"):
        bad = {r["probe"] for r in rows if r["candidate"] == "impl" and r["reference"] == ref and r["layer"] == 0
               and r["status"] == "fail"}
        assert bad & {"rec_out", "state_rec", "attn_out"}, (ref, bad)


@pytest.mark.parametrize("name, layer", [("normed-residual-alpha-dropped", 0), ("attn-normed-residual-from-input", 7)])
def test_a_residual_without_alpha_fails_at_resid_mid(run, policy, name, layer):
    """Planted: the lightning body drops alpha / the attention body adds the branch to the
    raw input. Everything before resid_mid passes; resid_mid fails at the layer's kind."""
    with applied(registry()[name]):
        st = all_statuses(run(policy, family="minimax", ref="hf"))
    assert st[("impl", "hf", layer, "attn_out")] == "pass"
    assert st[("impl", "hf", layer, "resid_mid")] == "fail"


def test_config_value_indexes_a_list():
    """The finding's condition ``layer_types.0``: a number indexes a list (harness/policy.py)."""
    from harness.policy import config_matches

    cond = {"layer_types.0": "linear_attention"}
    assert config_matches({"layer_types": ["linear_attention", "full_attention"]}, cond)
    assert not config_matches({"layer_types": ["full_attention", "linear_attention"]}, cond)
    assert not config_matches({"layer_types": []}, cond)


@pytest.mark.usefixtures("need_llamacpp")
def test_the_lightning_output_norms_eps_is_llamacpps_finding_within_its_measured_range(run, policy):
    """HF's lightning norm keeps the RMSNorm default 1e-6 (modeling_minimax.py:136), llama.cpp
    reads the file's eps (minimax-01.cpp:402-404): at rms_norm_eps 1e-5 (the fuzz draws it)
    llama.cpp differs from the norm on, a finding; impl follows HF. Past the range it was
    measured over (eps <= 0.01) nothing excuses it: the rows fail."""
    kw = dict(family="minimax", ref=HF_AND_LLAMACPP, schedule="prefill", tokens=6)
    rows = run(policy, overrides=(("rms_norm_eps", 1e-5),), **kw)
    assert not bad_rows(rows)
    st = all_statuses(rows)
    assert {v for (c, ref, _, _), v in st.items() if (c, ref) == ("impl", "hf")} == {"pass", "not-exposed"}
    assert st[("impl", "llamacpp", 0, "rec_out")] == "pass"  # before the norm: the same
    assert st[("impl", "llamacpp", 0, "attn_out")] == "finding"
    past = all_statuses(run(policy, overrides=(("rms_norm_eps", 0.05),), **kw))
    assert past[("impl", "llamacpp", 0, "attn_out")] == "fail"
    assert past[("impl", "hf", 0, "attn_out")] == "pass"
