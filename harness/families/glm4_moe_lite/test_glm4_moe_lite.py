"""glm4_moe_lite: DeepSeek V3's MLA with GLM's router, three-way; the gating
function llama.cpp guesses by depth and vocabulary when the file names none
(both sides of the switch); the latent norms' eps HF fixes at 1e-6; its files
are deepseek_v3's."""

from __future__ import annotations

import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses, bad_rows

pytestmark = pytest.mark.usefixtures("need_llamacpp")

NO_SCORING = (("scoring_func", None),)


def test_without_scoring_func_llamacpp_routes_by_softmax_at_this_depth(run, policy):
    st = all_statuses(run(policy, family="glm4_moe_lite", ref=HF_AND_LLAMACPP, kv="decode", overrides=NO_SCORING))
    assert all(s in ("pass", "not-exposed") for (c, _, _, _), s in st.items() if c == "impl")
    # the dense layer 0 agrees to its output; the first MoE layer's output differs
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"
    assert st[("llamacpp", "hf", 1, "resid_mid")] == "pass"
    assert st[("llamacpp", "hf", 1, "layer_out")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]


def test_at_glm_4_7_flash_depth_and_vocabulary_llamacpp_guesses_sigmoid(run, policy):
    """47 layers and 154880 tokens: deepseek2.cpp routes a file without a gating key
    by sigmoid, as HF does -- the same tiny widths agree to the logits."""
    over = NO_SCORING + (("num_hidden_layers", 47), ("vocab_size", 154880))
    rows = run(policy, family="glm4_moe_lite", ref=HF_AND_LLAMACPP, kv="decode", tokens=6, overrides=over, layers="0,1,46,-1")
    assert not bad_rows(rows)
    st = all_statuses(rows)
    assert st[("llamacpp", "hf", 46, "layer_out")] == "pass" and st[("llamacpp", "hf", -1, "logits")] == "pass"


def test_the_gating_findings_need_their_settings(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "glm4_moe_lite", "llamacpp", "hf", "layer_out", dict(NO_SCORING), layer=1, nmse=0.02)
    assert not finding(pol, "glm4_moe_lite", "llamacpp", "hf", "layer_out", {}, layer=1, nmse=0.02)
    assert not finding(pol, "glm4_moe_lite", "llamacpp", "hf", "layer_out",
                       dict(NO_SCORING + (("num_hidden_layers", 47), ("vocab_size", 154880))), layer=1, nmse=0.02)


def test_latent_norm_eps_hf_fixes_at_1e6(run, policy):
    """rms_norm_eps = 1e-5 (GLM-4.7-Flash's): llama.cpp normalises the latents with
    it, HF (and impl) with 1e-6 -- impl vs llama.cpp at the latents is ~1000x its
    eps-matched NMSE while impl vs HF is unchanged."""
    def latent(over):
        rows = run(policy, family="glm4_moe_lite", ref=HF_AND_LLAMACPP, kv="decode", overrides=over)
        return {(r["reference"], r["layer"]): r["nmse"] for r in rows
                if r["candidate"] == "impl" and r["probe"] == "q_latent" and r["status"] == "pass"}

    same, other = latent(()), latent((("rms_norm_eps", 1e-5),))
    for layer in (0, 1, 2):
        assert other[("llamacpp", layer)] > 50 * same[("llamacpp", layer)]
        assert other[("hf", layer)] < 1e-12
