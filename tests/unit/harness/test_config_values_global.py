"""harness.config_values.global_value: the one reader of a config key that transformers 5
may hold per layer (gemma4), used by coverage, the policy's finding conditions and the
feature switches."""

from __future__ import annotations

import pytest

from harness.config_values import global_value


class AmbiguousGlobalPerLayerAttributeError(RuntimeError):
    """transformers 5's name for a global read of a per-layer key (matched by name)."""


class _Config:
    head_dim = 8

    @property
    def num_key_value_heads(self):
        raise AmbiguousGlobalPerLayerAttributeError("num_key_value_heads is per layer")

    @property
    def broken(self):
        raise RuntimeError("something else went wrong")


def test_a_per_layer_key_reads_as_what_the_caller_says_and_any_other_error_is_raised():
    cfg = _Config()
    assert global_value(cfg, "head_dim") == 8
    assert global_value(cfg, "absent", 3) == 3
    assert global_value(cfg, "num_key_value_heads") is None
    assert global_value(cfg, "num_key_value_heads", per_layer="per layer") == "per layer"
    with pytest.raises(RuntimeError, match="something else"):
        global_value(cfg, "broken")


def test_gemma4s_real_config_reads_its_per_layer_keys_as_absent():
    from harness.families import get

    cfg = get("gemma4").make_config({"attention_k_eq_v": True})
    with pytest.raises(RuntimeError):
        cfg.head_dim  # noqa: B018 (transformers refuses the global read)
    assert global_value(cfg, "head_dim", per_layer="x") == "x"
