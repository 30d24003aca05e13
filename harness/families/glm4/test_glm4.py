"""glm4: interleaved partial RoPE, QKV biases and the branch norm, verified
against llama.cpp (broken in impl, each fails there); the 0.5 rotary default
HF and the converter share."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


@pytest.mark.parametrize("mutant,probe", [("rope-layout-swapped", "q_rope"), ("partial-rotary-one-pair-short", "q_rope"),
                                          ("post-norm-missing", "attn_out"), ("qkv-bias-dropped", "q")])
def test_a_broken_decoration_fails_against_llamacpp(run, policy, mutant, probe):
    with applied(registry()[mutant]):
        st = all_statuses(run(policy, family="glm4", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass" and st[("impl", "llamacpp", 0, probe)] == "fail"


def test_the_rotary_default_is_half_in_hf_and_in_the_file(policy, tmp_path):
    import gguf

    fam = get("glm4")
    config = fam.make_config({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    assert config.rope_parameters["partial_rotary_factor"] == 0.5  # Glm4Config's default
    assert len(fam.layer_configs(config)[0].rope.inv_freq) == 4  # 8 of 16 channels, 4 pairs
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "glm4")
    fam.gguf_params(w, config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert kv["glm4.rope.dimension_count"] == 8
