"""phi3: the fused QKV split, LongRoPE's short and long factor sets (which one each
reference takes, and when they differ), and the sliding window llama.cpp drops."""

from __future__ import annotations

import numpy as np
import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

LONG = (("original_max_position_embeddings", 8),)  # 16 tokens > 8 and n_ctx_seq 256 > 8: long on every side
BETWEEN = (("original_max_position_embeddings", 32),)  # 16 tokens <= 32 < 256: HF short, llama.cpp long
WINDOW = (("sliding_window", 4),)


def _passes(rows):
    bad = [r for r in rows if r["status"] not in ("pass", "not-exposed")]
    assert not bad, bad[:3]


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_short_factors_three_way(run, policy, kv):
    rows = run(policy, family="phi3", ref=HF_AND_LLAMACPP, kv=kv)
    feats = set(rows[0]["features"].split(";"))
    assert {"longrope", "partial_rotary", "rope_attn_factor", "rope_neox"} <= feats
    _passes(rows)
    st = all_statuses(rows)
    for layer in (0, 1):
        for ref in ("hf", "llamacpp"):
            assert st[("impl", ref, layer, "q_rope")] == "pass"
        # phi3.cpp names neither wo's product nor the residual after it: HF alone checks wo
        assert st[("impl", "llamacpp", layer, "attn_out")] == "not-exposed"
        assert st[("impl", "hf", layer, "attn_out")] == "pass"


def test_the_description_is_the_short_set_and_its_attention_factor(case_run, policy):
    r = case_run(policy, "phi3", ref="hf")
    rope = r.layer_cfgs[0].rope
    assert rope.rotary_dim == 8 and rope.freq_factors == (1.0, 1.25, 1.875, 2.5)
    # HF _compute_longrope_parameters: sqrt(1 + ln(1024 / 256) / ln(256))
    assert rope.attention_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(256)))
    long_ = case_run(policy, "phi3", ref="hf", overrides=LONG).layer_cfgs[0].rope
    assert long_.freq_factors == (1.5, 3.0, 7.0, 13.0)


def test_long_factors_three_way(run, policy):
    """impl, HF's forward and llama.cpp take the long set for the whole sequence and
    agree; HF's cached path re-picks the set per call (its first calls short), a
    finding against each of the others (findings.toml), judged at L0 q_rope."""
    rows = run(policy, family="phi3", ref=HF_AND_LLAMACPP, kv="paged", overrides=LONG)
    _passes([r for r in rows if "hf_cached" not in (r["candidate"], r["reference"])])
    cached = [r for r in rows if "hf_cached" in (r["candidate"], r["reference"])]
    assert {r["status"] for r in cached} <= {"pass", "finding", "not-exposed"}
    st = all_statuses(rows)
    for pair in (("hf_cached", "hf"), ("impl", "hf_cached"), ("llamacpp", "hf_cached")):
        assert st[(*pair, 0, "q")] == "pass" and st[(*pair, 0, "q_rope")] == "finding"


def test_the_factor_set_is_compared(run, policy, monkeypatch):
    """Both sides of the switch: with the long set on both references, impl told
    the short set fails against each of them from q_rope on."""
    monkeypatch.setattr(get("phi3"), "_rope_set", lambda config: "short")
    st = all_statuses(run(policy, family="phi3", ref=HF_AND_LLAMACPP, kv="decode", overrides=LONG))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q")] == "pass"
        assert st[("impl", ref, 0, "q_rope")] == "fail"
    assert st[("llamacpp", "hf", 0, "q_rope")] == "pass"


def test_hf_takes_the_short_set_where_llamacpp_takes_the_long_one(run, policy):
    """An original length below llama.cpp's context (256) but above the sequence:
    HF rotates with short_factor, llama.cpp (and impl) with long_factor -- a finding,
    bounded; impl vs HF is excused only where impl vs llama.cpp passes, and impl's wo
    (not exposed by llama.cpp) is reported unguarded, never passed."""
    rows = run(policy, family="phi3", ref=HF_AND_LLAMACPP, kv="decode", overrides=BETWEEN)
    st = all_statuses(rows)
    assert st[("llamacpp", "hf", 0, "q")] == "pass"
    assert st[("llamacpp", "hf", 0, "q_rope")] == "finding"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass"
    assert st[("impl", "hf", 0, "q_rope")] == "finding"
    assert st[("impl", "hf", 0, "attn_out")] == "unguarded"
    assert not [r for r in rows if r["status"] == "fail"]


@pytest.mark.parametrize("overrides,expect", [((), "pass"), (WINDOW, "finding")], ids=["no-window", "window"])
def test_llamacpp_drops_the_window(run, policy, overrides, expect):
    """phi3.cpp disables SWA whatever the file says: with sliding_window set impl
    (= HF) passes against HF and differs from llama.cpp from attn_probs on."""
    st = all_statuses(run(policy, family="phi3", ref=HF_AND_LLAMACPP, kv="batched", overrides=overrides))
    assert st[("impl", "hf", 0, "attn_probs")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_probs")] == expect
    assert st[("llamacpp", "hf", 1, "attn_probs")] == expect


def test_gguf_is_the_converters(case_run, gguf_export, policy):
    import gguf


    r = case_run(policy, "phi3", ref="hf")
    path = gguf_export.export(r.family, r.base_model, r.config, "f32", 0, None)
    rd = gguf.GGUFReader(str(path))
    t = {x.name: np.asarray(x.data) for x in rd.tensors}
    np.testing.assert_array_equal(t["rope_factors_long.weight"], np.float32([1.5, 3.0, 7.0, 13.0]))
    np.testing.assert_array_equal(t["rope_factors_short.weight"], np.float32([1.0, 1.25, 1.875, 2.5]))
    qkv = r.base_model.model.layers[0].self_attn.qkv_proj.weight.detach().numpy()
    np.testing.assert_array_equal(t["blk.0.attn_qkv.weight"], qkv)  # the fused layout, as the converter keeps it
    f = {k: rd.fields[k] for k in rd.fields}
    val = float(f["phi3.rope.scaling.attn_factor"].parts[-1][0])
    assert val == pytest.approx(np.sqrt(1 + np.log(4) / np.log(256)), rel=1e-6)
    assert int(f["phi3.rope.dimension_count"].parts[-1][0]) == 8


@pytest.mark.parametrize("name", ["longrope-factors-multiply", "longrope-factors-reversed"])
def test_broken_factors_fail_against_both_references(run, policy, name):
    m = registry()[name]
    with applied(m):
        st = all_statuses(run(policy, family="phi3", ref=HF_AND_LLAMACPP, kv="paged", overrides=dict(m.case).get("overrides", ())))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q")] == "pass"
        assert st[("impl", ref, 0, "q_rope")] == "fail"
