"""--weights realistic: a trained model's statistics on the seeded weights
(harness/families/base.py ``Family.realistic_weights``): outlier channels in the
residual stream and scores that span tens -- and every side still agrees on them."""

from __future__ import annotations

import numpy as np
import pytest

from harness.pytest_fixtures import case_run, run
from harness.testing import HF_AND_LLAMACPP


def _scores(hf, layer):
    q = np.asarray(hf.probes[f"L{layer}.q_rope"])
    k = np.asarray(hf.probes[f"L{layer}.k_rope"])
    k = k[:, :, np.repeat(np.arange(k.shape[2]), q.shape[2] // k.shape[2])]
    return np.einsum("sthd,suhd->shtu", q, k) / np.sqrt(q.shape[-1])


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_realistic_weights_have_outliers_and_large_scores(policy, family):
    rnd = case_run(policy, family, ref="hf", tokens=32).capture("hf")
    real = case_run(policy, family, ref="hf", tokens=32, weights="realistic").capture("hf")
    x0, x1 = np.asarray(rnd.probes["L0.layer_in"]), np.asarray(real.probes["L0.layer_in"])
    # a few channels carry the residual's magnitude: their share of its energy
    energy = (x1 ** 2).sum(axis=(0, 1))
    top = np.sort(energy)[::-1]
    assert top[: max(2, x1.shape[-1] // 64)].sum() > 0.9 * energy.sum()
    assert np.abs(x1).max() > 15 * np.abs(x0).max()
    s0, s1 = _scores(rnd, 0), _scores(real, 0)
    assert s0.std() < 2 and 3 < s1.std() < 20 and 10 < np.abs(s1).max() < 100
    # coherent: each outlier channel keeps its sign from token to token (its mean over the
    # tokens well above its spread), where the random weights' channels average out
    k = max(2, x1.shape[-1] // 64)
    chans = np.argsort(energy)[::-1][:k]
    flat = x1.reshape(-1, x1.shape[-1])[:, chans]
    assert (np.abs(flat.mean(axis=0)) > 1.5 * flat.std(axis=0)).all()
    assert (np.sign(flat) == np.sign(flat.mean(axis=0))).mean() > 0.9


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_realistic_weights_pass_three_way(policy, need_llamacpp, family):
    rows = run(policy, family=family, ref=HF_AND_LLAMACPP, weights="realistic", kv="paged")
    bad = [(r["candidate"], r["reference"], r["layer"], r["probe"], r["status"]) for r in rows
           if r["status"] not in ("pass", "finding", "not-exposed")]
    assert not bad, bad[:5]
    assert {r["weights"] for r in rows} == {"realistic"} and "weights=realistic" in rows[0]["case_id"]


def test_weights_is_checked_before_any_work(capsys):
    from harness.cli import main

    assert main(["run", "--family", "llama", "--weights", "pretrained"]) == 2
    err = capsys.readouterr().err
    assert "unknown weights 'pretrained'" in err and "trained" in err and len(err.strip().splitlines()) == 1
