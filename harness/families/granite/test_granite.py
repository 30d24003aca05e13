"""granite specifics: the attention multiplier IS the softmax scale, the residual
multiplier sits between attn_out and resid_mid, the embedding multiplier is
compared at the scaled embedding, and the converter's multiplier keys."""

from __future__ import annotations

from impl.config import softmax_scale
import numpy as np

from harness.families import get
from harness.mutants import registry


def test_tiny_config_exercises_its_decorations(case_run, policy):
    r = case_run(policy, "granite", ref="hf")
    assert {"attn_scale", "residual_multiplier", "o_bias", "qkv_bias"} <= set(r.features)
    lc = r.layer_cfgs[0]
    assert softmax_scale(lc) == 0.15 and lc.residual_multiplier == 0.22
    hf = r.capture("hf").probes
    # resid_mid = layer_in + 0.22 * attn_out (GraniteDecoderLayer.forward)
    np.testing.assert_allclose(hf["L0.resid_mid"], hf["L0.layer_in"] + 0.22 * hf["L0.attn_out"], atol=1e-5)
    # the model-level embeddings probe is the first layer's (scaled) input
    np.testing.assert_array_equal(hf["embeddings"], hf["L0.layer_in"])
    raw = r.base_model.model.embed_tokens.weight.detach().numpy()[r.tokens]
    np.testing.assert_allclose(hf["embeddings"], raw * 12.0, rtol=1e-6)


def test_every_decoration_has_a_mutant(case_run, policy):
    covered = {m.decoration for m in registry().values()}
    feats = set(case_run(policy, "granite", ref="hf").features) - {"kv_decode"}
    assert feats <= covered, feats - covered


def test_gguf_metadata_carries_the_multipliers(case_run, policy, tmp_path):
    import gguf

    r = case_run(policy, "granite", ref="hf")
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "granite")
    get("granite").gguf_params(w, r.config)
    kv = {k: v.value for d in w.kv_data for k, v in d.items()}
    assert kv["granite.attention.scale"] == np.float32(0.15)
    assert kv["granite.embedding_scale"] == 12.0 and kv["granite.residual_scale"] == np.float32(0.22)
    assert kv["granite.logit_scale"] == 8.0 and kv["granite.rope.dimension_count"] == 16
    assert "granite.attention.key_length" not in kv  # the converter pops head_dim
