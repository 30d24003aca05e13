"""olmoe: three-way on the whole-row QK norm with experts; the converter's fixed
eps on both sides (HF's 1e-5: the file says 1e-5 and both agree; another eps:
the file still says 1e-5); llama.cpp's MHA-only k_norm refused in one line;
a broken QK norm in impl fails."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="olmoe", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_the_file_carries_the_converter_s_eps_whatever_the_config_says(gguf_export, gguf_import, eps):
    import gguf
    import numpy as np

    from harness import families

    fam = families.get("olmoe")
    config = fam.make_config({"rms_norm_eps": eps})
    assert config.rms_norm_eps == eps
    path = str(gguf_export.export(fam, fam.build_model(config, 5), config, "f32", 5, None))
    field = gguf.GGUFReader(path).get_field("olmoe.attention.layer_norm_rms_epsilon")
    assert np.float32(field.parts[field.data[0]][0]) == np.float32(1e-5)  # OlmoeModel.set_gguf_parameters
    assert gguf_import.load(path).config.rms_norm_eps == pytest.approx(1e-5)


def test_gqa_is_refused_against_llamacpp_in_one_line(policy):
    from harness.families import get

    fam = get("olmoe")
    why = fam.lc_refusal(fam.make_config({"num_key_value_heads": 2}))
    assert why and "attn_k_norm" in why and "\n" not in why
    assert fam.lc_refusal(fam.make_config({})) is None
    assert fam.hf_refusal(fam.make_config({"num_key_value_heads": 2})) is None


def test_a_broken_qk_norm_fails_against_llamacpp(run, policy):
    # the whole-row norm taken per head (qwen3's form instead of olmoe's)
    with applied(registry()["qk-norm-row-per-head"]):
        st = all_statuses(run(policy, family="olmoe", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "q_rope")] == "fail"
