"""ministral3: YaRN plus the attention temperature with offset 0 (floor(pos / s)),
three-way; llama4's offset (floor((pos + 1) / s)) planted in impl fails at q_rope
against every reference; the temperature switched off agrees too."""

from __future__ import annotations

import dataclasses

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def _bad(rows):
    return [(r["candidate"], r["reference"], r["layer"], r["probe"], r["status"]) for r in rows
            if r["status"] not in ("pass", "not-exposed")]


@pytest.mark.parametrize("kv", ["decode", "batched"])
def test_three_way(run, policy, kv):
    rows = run(policy, family="ministral3", ref=HF_AND_LLAMACPP, kv=kv)
    assert "temperature_no_offset" in rows[0]["features"].split(";")
    assert not _bad(rows), _bad(rows)[:5]


def test_the_description_is_offset_zero(case_run, policy):
    lc = case_run(policy, "ministral3", ref="hf").layer_cfgs[0]
    # HF get_llama_4_attn_scale: 1 + beta * log(1 + floor(pos / original_max_position_embeddings))
    assert (lc.temperature.floor_scale, lc.temperature.attn_scale, lc.temperature.offset) == (8.0, 0.5, 0)
    assert lc.rope.kind == "yarn"


def test_llama4s_offset_fails_at_q_rope(run, policy, monkeypatch):
    """The planted bug: impl with llama4's floor((pos + 1) / s) -- one position early
    at 7 and 15 -- fails from q_rope on against HF and llama.cpp; q and k_rope pass."""
    fam = get("ministral3")
    orig = type(fam)._temperature
    monkeypatch.setattr(fam, "_temperature",
                        lambda config: dataclasses.replace(orig(fam, config), offset=1))
    st = all_statuses(run(policy, family="ministral3", ref=HF_AND_LLAMACPP, kv="decode"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q")] == "pass"
        assert st[("impl", ref, 0, "k_rope")] == "pass"
        assert st[("impl", ref, 0, "q_rope")] == "fail"


def test_without_the_temperature_impl_fails(run, policy, monkeypatch):
    """The other side of the switch: impl without the temperature (the mistral3
    family's layer) fails at q_rope against both references, which apply it."""
    fam = get("ministral3")
    monkeypatch.setattr(fam, "_temperature", lambda config: None)
    st = all_statuses(run(policy, family="ministral3", ref=HF_AND_LLAMACPP, kv="decode"))
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q_rope")] == "fail"


def test_mscale_is_a_finding_against_llamacpp(run, policy):
    """llama.cpp assumes YaRN's mscale is 1 (llama-context.cpp): at mscale 2 HF's cos
    and sin are 1.257x llama.cpp's, a finding from q_rope on (within its bound);
    impl agrees with HF, and at mscale 1 (test_three_way) everything passes."""
    st = all_statuses(run(policy, family="ministral3", ref=HF_AND_LLAMACPP, kv="decode",
                          overrides=(("rope_parameters.mscale", 2.0),)))
    assert st[("impl", "hf", 0, "q_rope")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "pass"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "finding"
    assert st[("llamacpp", "hf", 0, "q_rope")] == "finding"
