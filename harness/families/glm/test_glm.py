"""glm: three-way in every KV mode on interleaved partial RoPE with q/k/v
biases; the chatglm converter's fixed values on both sides: the file says eps
1e-5 and theta 10000 whatever GlmConfig says (another theta: a finding; a
smaller eps: a finding, bounded), rotates hidden / heads * 0.5 channels, and a
head width other than hidden / heads is refused in one line (llama.cpp does
not load it); a broken rotation in impl fails against llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

THETA = (("rope_parameters.rope_theta", 500000.0),)


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="glm", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert ("impl", "llamacpp", 1, "q_rope") in st


def _keys(over, tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "chatglm")
    get("glm").gguf_params(w, get("glm").make_config(dict(over)))
    return {k.removeprefix("chatglm."): v.value for d in w.kv_data for k, v in d.items()}


def test_the_file_carries_the_converter_s_fixed_values(tmp_path):
    kv = _keys({"rms_norm_eps": 1.5625e-07, "rope_parameters.rope_theta": 500000.0}.items(), tmp_path)
    assert np.isclose(kv["attention.layer_norm_rms_epsilon"], 1e-5)  # layernorm_epsilon absent
    assert np.isclose(kv["rope.freq_base"], 10000.0)  # rope_ratio absent
    assert kv["rope.dimension_count"] == 8 and kv["context_length"] == 64  # hidden // heads * 0.5; n_embed


def test_another_theta_is_a_finding_between_the_references(run, policy):
    st = all_statuses(run(policy, family="glm", ref=HF_AND_LLAMACPP, kv="decode", overrides=THETA))
    assert all(s == "pass" for (c, r, *_), s in st.items() if (c, r) == ("impl", "hf"))
    ref = {k[2:]: s for k, s in st.items() if k[:2] == ("llamacpp", "hf")}
    assert ref[(0, "q")] == "pass" and ref[(0, "q_rope")] == ref[(1, "layer_out")] == "finding"
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "finding"


def test_the_findings_need_their_settings(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "glm", "llamacpp", "hf", "q_rope", dict(THETA), nmse=0.04, layer=0)
    assert not finding(pol, "glm", "llamacpp", "hf", "q_rope", {}, nmse=0.04, layer=0)
    assert not finding(pol, "glm", "llamacpp", "hf", "q_rope", dict(THETA), nmse=33.0, layer=0)
    small = {"rms_norm_eps": 1.5625e-07}
    assert finding(pol, "glm", "llamacpp", "hf", "attn_in", small, nmse=1e-9, layer=0)
    assert not finding(pol, "glm", "llamacpp", "hf", "attn_in", {}, nmse=1e-9, layer=0)
    assert not finding(pol, "glm", "llamacpp", "hf", "attn_in", {"rms_norm_eps": 1e-4}, nmse=1e-9, layer=0)
    assert not finding(pol, "glm", "llamacpp", "hf", "attn_in", small, nmse=33.0, layer=0)  # 2 per token at 16


def test_a_head_width_other_than_hidden_over_heads_is_hf_only(run, policy, monkeypatch):
    fam = get("glm")
    over = (("head_dim", 8),)
    why = fam.lc_refusal(fam.make_config(dict(over)))
    assert why and why.startswith("head_dim=8 x 4 heads != hidden_size=64") and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None
    rows = run(policy, family="glm", ref="hf", kv="decode", overrides=over)
    assert rows and all(r["status"] == "pass" for r in rows)
    # the refusal is llama.cpp's own: without it, chatglm.cpp does not load the file
    monkeypatch.setattr(fam, "lc_refusal", lambda config: None)
    rows = run(policy, family="glm", ref="llamacpp", kv="decode", overrides=over)
    assert [r["status"] for r in rows] == ["error"] and "wrong shape" in rows[0]["reason"]


@pytest.mark.parametrize("mutant", ["interleaved-rotation-reversed", "partial-rotary-one-pair-short"])
def test_a_broken_rotation_fails_against_llamacpp(run, policy, mutant):
    with applied(registry()[mutant]):
        st = all_statuses(run(policy, family="glm", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"
