"""hunyuan_v1_dense: the QK norm after RoPE, verified against llama.cpp; the
NTK-alpha RoPE both references compute from one scaled base (the converter's
own), three-way."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

NTK = (("rope_parameters", {"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0, "factor": 1.0}),
       ("max_position_embeddings", 32768))


def test_a_post_rope_norm_that_skips_k_fails_against_llamacpp(run, policy):
    with applied(registry()["post-rope-norm-skips-k"]):
        st = all_statuses(run(policy, family="hunyuan_v1_dense", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 0, "k_rope")] == "fail"


def test_ntk_alpha_rope_three_way(run, policy, tmp_path):
    import gguf

    fam = get("hunyuan_v1_dense")
    config = fam.make_config(dict(NTK))
    plain = fam.layer_configs(fam.make_config({}))[0].rope
    ntk = fam.layer_configs(config)[0].rope
    base = 10000.0 * 1000.0 ** (16 / 14)
    np.testing.assert_allclose(ntk.inv_freq, [base ** (-2 * i / 16) for i in range(8)], rtol=1e-12)
    assert not np.allclose(ntk.inv_freq, plain.inv_freq)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "hunyuan-dense")
    fam.gguf_params(w, config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert np.isclose(kv["hunyuan-dense.rope.freq_base"], base) and kv["hunyuan-dense.context_length"] == 262144
    st = all_statuses(run(policy, family="hunyuan_v1_dense", ref=HF_AND_LLAMACPP, kv="paged", overrides=NTK))
    assert st[("impl", "llamacpp", 1, "q_rope")] == "pass" and all(s == "pass" for s in st.values())
