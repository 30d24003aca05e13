"""mimo_v2_flash: where the value scale lives (HF on V, llama.cpp and impl after
wo) and its canonicalization; the per-layer shapes (V width, KV heads, sinks,
window); the HF-only attention_bias, which llama.cpp loads and ignores."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses


def test_layer_shapes_follow_the_layer_type():
    from harness.families import get

    fam = get("mimo_v2_flash")
    cfgs = fam.layer_configs(fam.make_config({}))
    assert [c.n_kv_heads for c in cfgs] == [2, 4, 4, 2]
    assert [c.window.size if c.window else None for c in cfgs] == [None, 5, 5, None]
    assert {c.dv for c in cfgs} == {8} and {c.head_dim for c in cfgs} == {16}
    assert [c.rope.theta for c in cfgs] == [1e6, 1e4, 1e4, 1e6] and {c.rope.rotary_dim for c in cfgs} == {8}
    assert {c.value_scale for c in cfgs} == {0.707}


def test_hf_canonical_divides_exactly_the_value_scale(case_run, policy, monkeypatch):
    """HF's eager output and o_proj input carry the scale (HF scales V); the canonical
    probes are those divided by it, nothing else; q/k/v and attn_out are untouched."""
    from harness.families.base import LlamaLike
    from harness.references.hf import capture as hf

    run_ = case_run(policy, "mimo_v2_flash")
    fam = run_.family
    args = (fam, run_.base_model, run_.config, run_.layer_cfgs, run_.tokens)
    canon = hf.capture(*args)
    monkeypatch.setattr(fam, "hf_canonical", functools.partial(LlamaLike.hf_canonical, fam))
    raw = hf.capture(*args)
    for i in range(4):
        for p in ("attn_heads", "attn_branch"):
            np.testing.assert_allclose(raw[f"L{i}.{p}"], canon[f"L{i}.{p}"] * 0.707, rtol=1e-12, atol=0)
            assert not np.allclose(raw[f"L{i}.{p}"], canon[f"L{i}.{p}"], rtol=1e-3)
        for p in ("v", "attn_probs", "attn_out", "resid_mid"):
            np.testing.assert_array_equal(raw[f"L{i}.{p}"], canon[f"L{i}.{p}"])


@pytest.mark.usefixtures("need_llamacpp")
def test_sinks_and_window_act_on_the_sliding_layers(case_run, policy):
    """The sliding layers' probabilities sum to less than 1 (the sink takes the rest)
    and vanish outside the window; the full layers' sum to 1 over all past keys."""
    run_ = case_run(policy, "mimo_v2_flash", ref="llamacpp")
    for ref in ("hf", "llamacpp"):
        probs = run_.capture(ref).probes
        for i, swa in enumerate([False, True, True, False]):
            p = probs[f"L{i}.attn_probs"][0]  # [heads, q, k]
            sums = p.sum(-1)
            if swa:
                assert (sums < 1 - 1e-3).all(), (ref, i)
                q, k = np.indices(p.shape[1:])
                assert np.abs(p[:, q - k >= 5]).max() == 0.0, (ref, i)
                assert p[:, (q - k == 4)].min() > 0.0, (ref, i)
            else:
                np.testing.assert_allclose(sums, 1.0, atol=1e-6)


@pytest.mark.usefixtures("need_llamacpp")
def test_attention_bias_is_a_finding_against_llamacpp(run, policy):
    rows = run(policy, family="mimo_v2_flash", ref=HF_AND_LLAMACPP, overrides=(("attention_bias", True),))
    st = all_statuses(rows)
    assert "qkv_bias" in rows[0]["features"].split(";")
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "finding"
    assert st[("llamacpp", "hf", 0, "attn_in")] == "pass"
    assert st[("llamacpp", "hf", 0, "q")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]


@pytest.mark.usefixtures("need_llamacpp")
def test_llamacpp_loads_the_q_bias_and_ignores_it(case_run, policy):
    """The cause of the finding, measured: llama.cpp's q is its own attn_in times wq,
    without the bias HF adds."""
    run_ = case_run(policy, "mimo_v2_flash", ref="llamacpp", overrides=(("attention_bias", True),))
    lc = run_.capture("llamacpp").probes
    w = run_.weights_for("float32")[0]
    assert np.abs(w["bq"]).max() > 0.05
    q = (lc["L0.attn_in"] @ w["wq"].T).reshape(lc["L0.q"].shape)
    np.testing.assert_allclose(lc["L0.q"], q, atol=2e-5)
    assert not np.allclose(lc["L0.q"], q + w["bq"].reshape(q.shape[-2:]), atol=1e-2)
