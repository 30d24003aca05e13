"""solar_open: three-way in every KV mode on llama's attention with sigmoid-routed
experts; the converter's partial RoPE default (0.5, GLM-4.5's) on both sides:
with the factor written (1.0, HF's default) both references agree, without it
the file rotates half the head -- a finding, and impl keeps HF's model; a broken
rotation in impl fails against llama.cpp."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

UNNAMED = (("rope_parameters.partial_rotary_factor", None),)  # the key left out (config_kwargs)


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="solar_open", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]
    assert ("impl", "llamacpp", 1, "q_rope") in st


def _rope_width(config, tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "glm4moe")
    get("solar_open").gguf_params(w, config)
    return {k: v.value for d in w.kv_data for k, v in d.items()}["glm4moe.rope.dimension_count"]


def test_the_converter_s_default_factor_is_half(tmp_path):
    fam = get("solar_open")
    named, unnamed = fam.make_config({}), fam.make_config(dict(UNNAMED))
    assert "partial_rotary_factor" not in unnamed.rope_parameters  # as transformers 5 saves it
    assert _rope_width(named, tmp_path) == 16  # head_dim * 1.0
    assert _rope_width(unnamed, tmp_path) == 8  # head_dim * 0.5: Glm4MoeModel.set_gguf_parameters
    # HF rotates the whole head either way (impl's layers are the same)
    assert [repr(x) for x in fam.layer_configs(named)] == [repr(x) for x in fam.layer_configs(unnamed)]


def test_an_unnamed_factor_is_a_finding_between_the_references(run, policy):
    st = all_statuses(run(policy, family="solar_open", ref=HF_AND_LLAMACPP, kv="decode", overrides=UNNAMED))
    assert all(s == "pass" for (c, r, *_), s in st.items() if (c, r) == ("impl", "hf"))
    ref = {k[2:]: s for k, s in st.items() if k[:2] == ("llamacpp", "hf")}
    assert ref[(0, "q")] == ref[(0, "k")] == "pass"  # the projections agree, the rotation does not
    assert ref[(0, "q_rope")] == ref[(0, "k_rope")] == ref[(1, "layer_out")] == "finding"
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "finding"


def test_the_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    assert finding(pol, "solar_open", "llamacpp", "hf", "q_rope", dict(UNNAMED), nmse=0.6, layer=0)
    assert not finding(pol, "solar_open", "llamacpp", "hf", "q_rope", {}, nmse=0.6, layer=0)
    # bounded: the larger of the rotation's 4 and 2 per token (32 at the 16-token case)
    assert not finding(pol, "solar_open", "llamacpp", "hf", "q_rope", dict(UNNAMED), nmse=33.0, layer=0)
    assert not finding(pol, "solar_open", "llamacpp", "hf", "attn_probs", dict(UNNAMED), nmse=33.0, layer=0)


def test_a_broken_rotation_fails_against_llamacpp(run, policy):
    with applied(registry()["rope-layout-swapped"]):
        st = all_statuses(run(policy, family="solar_open", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"


def test_a_partial_factor_hf_cannot_rotate_by_is_refused_in_one_line():
    from harness.errors import UsageError

    # HF's apply_rotary_pos_emb has no partial split: its forward fails on a 0.5 cos / sin
    with pytest.raises(UsageError, match=r"partial_rotary_factor=0.5: HF SolarOpen rotates the whole head") as e:
        get("solar_open").make_config({"rope_parameters.partial_rotary_factor": 0.5})
    assert "\n" not in str(e.value)
