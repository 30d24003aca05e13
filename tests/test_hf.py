"""impl against HF transformers, family by family, layer by layer."""

from __future__ import annotations

import pytest

from conftest import run, statuses

FOUNDATION = ["llama", "qwen2", "qwen3"]
BACKENDS = [("numpy", "float64"), ("numpy", "float32"), ("torch", "float32")]


@pytest.mark.parametrize("family", FOUNDATION)
@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
@pytest.mark.parametrize("backend,dtype", BACKENDS)
def test_family_passes_against_hf(policy, family, kv, backend, dtype):
    rows = run(policy, family=family, ref="hf", backend=backend, dtype=dtype, kv=kv)
    st = statuses(rows)
    assert st and all(s == "pass" for s in st.values()), {k: v for k, v in st.items() if v != "pass"}
    probes = {p for (_, _, p) in st}
    # every probe of the attention half was compared, not just some
    assert {"attn_in", "q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out",
            "resid_mid"} <= probes


@pytest.mark.parametrize("overrides,tokens", [
    ((("num_key_value_heads", 1),), 16),  # MQA
    ((("head_dim", 12),), 16),  # not a power of two
    ((("num_hidden_layers", 3),), 37),
    ((("num_key_value_heads", 1), ("head_dim", 12), ("num_hidden_layers", 3)), 37),
])
@pytest.mark.parametrize("family", FOUNDATION)
def test_odd_shapes(policy, family, overrides, tokens):
    rows = run(policy, family=family, ref="hf", kv="paged", tokens=tokens, overrides=overrides)
    st = statuses(rows)
    assert st and all(s == "pass" for s in st.values())
    n_layers = dict(overrides).get("num_hidden_layers", 2)
    assert {layer for (_, layer, _) in st} == set(range(n_layers))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_judged_against_the_oracle(policy, dtype):
    rows = run(policy, family="qwen3", ref="hf", backend="torch", dtype=dtype, kv="batched")
    impl_rows = [r for r in rows if r["candidate"] == "impl"]
    assert impl_rows and all(r["status"] == "pass" for r in impl_rows)
    assert all(r["nmse_ref_oracle"] > 0 and "nmse_cand_oracle" in r for r in impl_rows)


def test_sliding_window_override(policy):
    rows = run(policy, family="qwen2", ref="hf", kv="batched", schedule="decode",
               overrides=(("use_sliding_window", True), ("sliding_window", 5), ("max_window_layers", 1)))
    assert all(s == "pass" for s in statuses(rows).values())
    assert "sliding_window" in rows[0]["features"]


def test_hf_float64_is_judged_at_hf_precision(policy):
    # HF's float32 side paths (norms, softmax, RoPE tables) are promoted in a float64 capture
    # (references/hf/float64.py), so float64 is judged at float64; the row says which precision
    rows = run(policy, family="llama", ref="hf", dtype="float64")
    assert {r["cmp_dtype"] for r in rows} == {"float64"}
