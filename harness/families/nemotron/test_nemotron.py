"""nemotron: LayerNorm1P with bias and partial neox RoPE, verified against
llama.cpp (broken in impl, each fails there); head_dim must be hidden / heads
for llama.cpp (both sides: the default agrees, another width is refused)."""

from __future__ import annotations

import pytest

from harness.mutants import applied, registry
from harness.testing import all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


@pytest.mark.parametrize("mutant,probe", [("layernorm-bias-dropped", "attn_in"), ("layernorm-mean-kept", "attn_in"),
                                          ("partial-rotary-pairs-from-tail", "q_rope")])
def test_a_broken_decoration_fails_against_llamacpp(run, policy, mutant, probe):
    with applied(registry()[mutant]):
        st = all_statuses(run(policy, family="nemotron", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, probe)] == "fail"


def test_a_head_dim_other_than_hidden_over_heads_is_hf_only(run, policy):
    over = (("head_dim", 8),)
    rows = run(policy, family="nemotron", ref="hf", kv="paged", overrides=over)
    assert rows and all(r["status"] == "pass" for r in rows)
    rows = run(policy, family="nemotron", ref="llamacpp", kv="paged", overrides=over)
    assert [r["status"] for r in rows] == ["error"] and "wrong shape" in rows[0]["reason"]
