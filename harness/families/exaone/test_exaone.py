"""exaone: llama on llama.cpp's exaone graph, which rotates NEOX: the converter
does NOT permute Q/K (permuting them breaks q), the rope dimension count comes
from hidden / heads. The converter's activation_function trap is in
tests/test_gguf_files.py (it runs llama.cpp's converter)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_a_permutation_breaks_q(run, policy, monkeypatch):
    from harness.families._convert import permute_rows

    fam = get("exaone")

    def permuted(name, data, config):
        if name.endswith("q_proj.weight"):
            return permute_rows(data, config.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return permute_rows(data, config.num_key_value_heads)
        return data

    monkeypatch.setattr(fam, "gguf_transform", permuted)
    st = all_statuses(run(policy, family="exaone", ref=HF_AND_LLAMACPP))
    assert st[("impl", "hf", 0, "q")] == "pass" and st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "fail"


def test_the_rope_dimension_count_is_hidden_over_heads(case_run, policy, tmp_path):
    import gguf

    r = case_run(policy, "exaone", ref="hf", overrides=(("rope_parameters.partial_rotary_factor", 0.5),))
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "exaone")
    get("exaone").gguf_params(w, r.config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert kv["exaone.rope.dimension_count"] == 8  # 0.5 * (64 // 4): ExaoneModel.set_gguf_parameters
    assert "exaone.vocab_size" not in kv  # a TextModel: no LlamaModel keys
    assert np.isclose(kv["exaone.rope.freq_base"], 500000.0)
