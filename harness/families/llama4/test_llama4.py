"""llama4: chunked windows, NoPE layers with attention temperature, the L2 QK
norm after RoPE -- and the HF-only configs that make the chunk and the
temperature visible at 16 tokens (llama.cpp hard-codes 8192 for both)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_rotation_step_finding

pytestmark = pytest.mark.usefixtures("need_llamacpp")

CHUNK = (("attention_chunk_size", 6),)
TEMP = (("floor_scale", 2), ("attn_scale", 0.5))


def _layers():
    from harness.families import get

    fam = get("llama4")
    return fam, [fam.layer_config(fam.make_config({}), i) for i in range(4)]


def test_default_config_maps_the_decorations():
    """Layers 0-2: interleaved RoPE, L2 norm after it, chunked (8192); layer 3: NoPE,
    temperature, no norm, full attention -- llama.cpp's fixed pattern."""
    _, lcs = _layers()
    for lc in lcs[:3]:
        assert lc.rope is not None and lc.rope.layout == "interleaved"
        assert lc.qk_norm.where == "post_rope" and lc.qk_norm.norm.kind == "l2"
        assert lc.window.kind == "chunked" and lc.window.size == 8192
        assert lc.temperature is None
    nope = lcs[3]
    assert nope.rope is None and nope.qk_norm is None and nope.window is None
    assert (nope.temperature.floor_scale, nope.temperature.attn_scale) == (8192.0, 0.1)


def test_default_config_three_way_on_every_probe(run, policy):
    rows = run(policy, family="llama4", ref=HF_AND_LLAMACPP, kv="paged")
    assert not [r for r in rows if r["status"] not in ("pass",)], "the default config must agree everywhere"
    feats = set(rows[0]["features"].split(";"))
    assert {"chunked_window", "temperature", "qk_norm_post_rope", "nope_layers", "rope_interleaved"} <= feats
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        for layer in range(4):
            for probe in ("q", "k", "q_rope", "k_rope", "attn_probs", "attn_out"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)


@pytest.mark.parametrize("overrides", [CHUNK, TEMP], ids=["chunk", "temperature"])
@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_hf_only_setting_against_hf(run, policy, overrides, kv):
    rows = run(policy, family="llama4", ref="hf", kv=kv, overrides=overrides)
    assert rows and all(r["status"] == "pass" for r in rows)


def test_hf_only_chunk_is_active_and_llamacpp_ignores_it(case_run, run, policy):
    rows = run(policy, family="llama4", ref=HF_AND_LLAMACPP, kv="paged", overrides=CHUNK)
    st = all_statuses(rows)
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    # impl and HF agree; llama.cpp (chunk 8192) disagrees from the first chunked attn_probs
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 0, "k_rope")] == "pass"
    for layer in (0, 1, 2):
        assert st[("impl", "llamacpp", layer, "attn_probs")] == "finding"
    assert st[("impl", "llamacpp", 3, "attn_probs")] == "pass"  # the NoPE layer is full attention
    assert st[("llamacpp", "hf", 0, "attn_probs")] == "finding"
    # the window really cuts: HF gives no weight across a chunk boundary, llama.cpp does
    run_ = case_run(policy, "llama4", kv="paged", overrides=CHUNK)
    hf = run_.capture("hf").probes["L0.attn_probs"]
    lc = run_.capture("llamacpp").probes["L0.attn_probs"]
    assert np.all(hf[:, :, 6:, :6] == 0) and np.all(hf[:, :, 12:, :12] == 0)
    assert lc[:, :, 6:, :6].sum() > 1.0


def test_hf_only_temperature_is_active_and_llamacpp_ignores_it(case_run, run, policy):
    rows = run(policy, family="llama4", ref=HF_AND_LLAMACPP, kv="decode", overrides=TEMP)
    st = all_statuses(rows)
    assert not [k for k, s in st.items() if s in ("fail", "error")]
    assert all(s == "pass" for (c, ref, layer, _), s in st.items() if c == "impl" and layer < 3)
    # llama.cpp's q (RESHAPE) is before the temperature, its q_rope (MUL) after it
    assert st[("impl", "llamacpp", 3, "q")] == "pass"
    assert st[("impl", "llamacpp", 3, "q_rope")] == "finding"
    assert st[("impl", "hf", 3, "q_rope")] == "pass"
    # HF scales the NoPE layer's q by log1p(floor((pos + 1) / 2)) * 0.5 + 1
    hf = case_run(policy, "llama4", overrides=TEMP).capture("hf").probes
    pos = np.arange(16)
    want = np.log1p(np.floor((pos + 1) / 2)) * 0.5 + 1
    ratio = np.linalg.norm(hf["L3.q_rope"][0], axis=(1, 2)) / np.linalg.norm(hf["L3.q"][0], axis=(1, 2))
    np.testing.assert_allclose(ratio, want, rtol=1e-5)
    assert want.max() > 2.0


def test_hf_only_nope_interval(run, policy):
    """no_rope_layer_interval=2: HF leaves layer 1 unrotated, llama.cpp (step 4) rotates it."""
    rows = run(policy, family="llama4", ref=HF_AND_LLAMACPP, overrides=(("no_rope_layer_interval", 2),))
    assert_llamacpp_rotation_step_finding(rows, before="q", ref_vs_ref=False)


def test_findings_need_their_settings(finding):
    """The llama4 findings are keyed on the HF-only settings: the default config gets none."""
    from harness.policy import load_policy

    pol = load_policy()
    for probe in ("attn_probs", "q_rope"):
        assert not finding(pol, "llama4", "impl", "llamacpp", probe, {}, layer=0)
    assert finding(pol, "llama4", "impl", "llamacpp", "attn_probs", dict(CHUNK), layer=0)
    assert finding(pol, "llama4", "impl", "llamacpp", "q_rope", dict(TEMP), layer=3)
    # ref vs ref: only downstream of where the setting first acts
    assert not finding(pol, "llama4", "llamacpp", "hf", "k_rope", dict(CHUNK), layer=0)
    assert not finding(pol, "llama4", "llamacpp", "hf", "attn_out", dict(TEMP), layer=2)
