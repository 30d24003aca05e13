"""harness/policy.py: the tolerance of one comparison -- the dtype's table, the probe's
entry over its default, overrides that match every key they name -- and the comparison's
precision (the coarser side)."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.policy import Policy, comparison_dtype, load_policy

TABLE = {"float32": {"default": {"nmse": 1e-10, "atol": 1e-4}, "attn_probs": {"atol": 1e-5}}}


def test_a_probe_s_entry_overrides_the_dtype_default_key_by_key():
    p = Policy("t", TABLE)
    assert p.tolerance("float32", "q") == ({"nmse": 1e-10, "atol": 1e-4}, "")
    assert p.tolerance("float32", "attn_probs") == ({"nmse": 1e-10, "atol": 1e-5}, "")


def test_an_override_applies_only_where_every_key_it_names_matches():
    o = {"family": "gemma2", "probe": "attn_out", "reference": "llamacpp", "nmse": 1e-6, "reason": "softcap"}
    p = Policy("t", TABLE, overrides=[o])
    assert p.tolerance("float32", "attn_out", "gemma2", "llamacpp") == ({"nmse": 1e-6, "atol": 1e-4}, "softcap")
    for args in (("float32", "attn_out", "llama", "llamacpp"), ("float32", "q", "gemma2", "llamacpp"),
                 ("float32", "attn_out", "gemma2", "hf")):
        assert p.tolerance(*args) == ({"nmse": 1e-10, "atol": 1e-4}, "")
    only = Policy("t", TABLE, overrides=[{"candidate": "llamacpp-fa", "atol": 1.0, "reason": "fa"}])
    assert only.tolerance("float32", "q", candidate="llamacpp-fa")[0]["atol"] == 1.0
    assert only.tolerance("float32", "q", candidate="impl")[0]["atol"] == 1e-4


def test_an_unknown_dtype_is_bad_input():
    with pytest.raises(UsageError, match="no dtype 'float8'"):
        Policy("t", TABLE).tolerance("float8", "q")


@pytest.mark.parametrize("a, b, want", [
    ("float32", "float64", "float32"), ("bfloat16", "float32", "bfloat16"), ("f16", "float32", "float16"),
    ("q8_0", "bfloat16", "q8_0"), ("q8_k", "q8_0", "q8_k"), ("ggml_q8_0", "float32", "ggml_q8_0"),
    ("float32", "ggml_bf16", "ggml_bf16"), ("bfloat16", "ggml_bf16", "bfloat16"),
])
def test_a_comparison_is_judged_at_its_coarser_side(a, b, want):
    assert comparison_dtype(a, b) == want and comparison_dtype(b, a) == want


def test_the_shipped_table_is_ordered_by_precision():
    p = load_policy()
    nmse = [p.tolerance(dt, "q")[0]["nmse"] for dt in ("float64", "float32", "bfloat16")]
    assert nmse == sorted(nmse) and len(set(nmse)) == 3


def _write(tmp_path, text):
    f = tmp_path / "tol.toml"
    f.write_text(text)
    return f


@pytest.mark.parametrize("text, says", [
    ("[dtype.float32.q]\nnmse = 1\natol = 1\n", "needs a 'default' entry"),
    ("[dtype.float32.default]\nnmse = 1\natol = 1\nfloor_width = 0\n", "floor_width 0 is not valid"),
    ("[dtype.float32.default]\nnmse = 1\natol = 1\nspeed = 2\n", "unknown keys ['speed']"),
    ("[[override]]\nfamily = 'llama'\nnmse = 1\n", "every override needs a written reason"),
    ("[dtypes]\n", "unknown table 'dtypes'"),
])
def test_a_policy_file_that_cannot_be_applied_as_written_is_refused(tmp_path, text, says):
    with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("]", r"\]")):
        load_policy(_write(tmp_path, text))
