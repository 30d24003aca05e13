"""olmo (v1): the QKV clamp, verified against both references."""

from __future__ import annotations

import numpy as np
import pytest

from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_clamp_is_active_and_agreed(case_run, run, policy):
    run_ = case_run(policy, "olmo", ref="hf")
    q = run_.capture("hf").probes["L0.q"]
    assert np.abs(q).max() == pytest.approx(1.0) and (np.abs(q) >= 1.0 - 1e-7).mean() > 0.1  # clamped, a lot
    rows = run(policy, family="olmo", ref=HF_AND_LLAMACPP)
    assert "qkv_clamp" in rows[0]["features"].split(";")
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):
        assert st[("impl", ref, 0, "q")] == "pass"
    assert st[("llamacpp", "hf", 0, "q")] == "pass"


def test_clamp_must_reach_llamacpp(run, policy, monkeypatch):
    from harness.families import get

    monkeypatch.setattr(get("olmo"), "_write_clamp", False)
    st = all_statuses(run(policy, family="olmo", ref="llamacpp"))
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "fail"
