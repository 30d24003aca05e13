"""The float32 oracle rule's floor grows with the reduction in front of the probe
(harness/scaling.py floor_for; fixtures/tolerance.toml [dtype.float32] floor_width).

The false alarm it answers: ``conformance run --family qwen3 --weights realistic
--set num_hidden_layers=24 --set hidden_size=256 --ref hf --schedule prefill``
failed L19 attn_probs, impl 4.48e-13 from the float64 oracle against HF's 9.12e-14
and a constant floor of 1e-13 (bound 4e-13). impl's NumPy backend sums its
narrow projections (qwen3: q 64, k / v 32 outputs over hidden 256) in OpenBLAS's
sgemm, 19 u^2 where HF's MKL is 12 u^2; impl's torch backend on the same case is
1.0x HF (docs/measurements/2026-12-02-float32-floor.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from harness import scaling
from harness.compare import judge_against_oracle, metrics
from harness.errors import UsageError
from harness.policy import load_policy

U2 = 2.0 ** -48  # float32's unit roundoff, squared


def _sequential_nmse(n: int, rng) -> float:
    """A float32 matmul whose every dot product of ``n`` terms is summed one term after
    another (np.add.accumulate in float32: no pairwise or blocked partial sums), its
    NMSE to the float64 product of the same float32 inputs."""
    x = rng.standard_normal((8, n)).astype(np.float32)
    w = rng.standard_normal((32, n)).astype(np.float32)
    seq = np.add.accumulate(x[:, None, :] * w[None, :, :], axis=-1, dtype=np.float32)[..., -1]
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    return float(((seq - exact) ** 2).sum() / (exact ** 2).sum())


def _float32_table():
    return load_policy(None).tolerance("float32", "attn_probs")[0]


def test_the_floor_keeps_its_headroom_over_a_sequential_float32_sum_at_every_width():
    """A sound float32 engine may sum a dot product one term at a time (~n u^2 / 10):
    the scaled floor stays >= 2x over it from the tiny configs' hidden 64 (5x there)
    to 4096; the constant floor it replaces does not (the assertion on it shows this
    test fails without the scaling)."""
    tol = _float32_table()
    rng = np.random.default_rng(0)
    seen = {}
    for n in (64, 256, 1024, 4096):
        e = seen[n] = _sequential_nmse(n, rng)
        assert 0.3 < e / (n * U2 / 10) < 3, (n, e / U2)  # the ~n u^2 / 10 the floor is derived from
        assert e * 2 <= scaling.floor_for(tol, n), (n, e, scaling.floor_for(tol, n))
    # the floor at the tiny configs' width is the table's own: mutants there see the same bound
    assert scaling.floor_for(tol, 64) == tol["nmse_floor"] == scaling.floor_for(tol, 32)
    assert seen[1024] > tol["nmse_floor"]  # unscaled, a sound sum alone is past the floor


def _probs_pair(cand_nmse: float, ref_nmse: float):
    """A probability-like probe, the oracle, and two sides at the given NMSE to it."""
    rng = np.random.default_rng(1)
    oracle = rng.random((4, 16, 16))
    oracle /= oracle.sum(-1, keepdims=True)

    def off(nmse, seed):
        d = np.random.default_rng(seed).standard_normal(oracle.shape)
        return oracle + d * np.sqrt(nmse * (oracle ** 2).sum() / (d ** 2).sum())

    return off(cand_nmse, 2), off(ref_nmse, 3), oracle


@pytest.mark.parametrize("width, cand, verdict", [
    (256, 4.48e-13, "pass"),  # the measured L19 attn_probs at hidden 256: a false alarm before
    (64, 4.48e-13, "fail"),   # the same numbers at the tiny width: the floor there is unchanged
    (256, 4e-12, "fail"),     # a bug 10x the rounding at hidden 256 still fails
    (4096, 4e-11, "fail"),    # at a real model's width too
])
def test_the_oracle_rule_applies_the_floor_at_the_layers_width(width, cand, verdict):
    tol = scaling.scaled(_float32_table(), None, "float32", 1.0, width)
    a, b, oracle = _probs_pair(cand, 9.12e-14)
    status, reason, allowed = judge_against_oracle(metrics(a, oracle, "attn_probs"), metrics(b, oracle, "attn_probs"),
                                                   tol)
    assert status == verdict, (width, cand, reason, allowed)


def test_the_judge_reads_the_width_from_the_layer_description():
    from harness.pipeline.judge import Judge, JudgeRequest
    from impl import LayerConfig

    def judge(hidden):
        lc = LayerConfig(hidden_size=hidden, n_heads=4, n_kv_heads=2, head_dim=16)
        req = JudgeRequest(case=None, family="qwen3", config=None, layer_cfgs=(lc, lc), policy=None,
                           selection=None, features=(), variant=None, candidate="impl", teacher_forced=True,
                           weight_dtype="f32")
        return Judge(req)

    assert judge(256).reduction_width(1) == 256 and judge(64).reduction_width(0) == 64
    assert judge(256).reduction_width(None) == 256  # a probe of no layer: behind every layer


def _recurrence_nmse(n: int, rng) -> float:
    """A decaying state carried row after row in float32 (s = a s + b x, decay a within
    1e-3 of 1: a head that remembers every row), its NMSE to the float64 recurrence on
    the same float32 inputs after ``n`` rows."""
    a = np.exp(-rng.uniform(0, 1e-3, 256)).astype(np.float32)
    b, x = (rng.standard_normal((n, 256)).astype(np.float32) for _ in range(2))
    s32, s64 = np.zeros(256, np.float32), np.zeros(256)
    for t in range(n):
        s32 = a * s32 + b[t] * x[t]
        s64 = a.astype(np.float64) * s64 + b[t].astype(np.float64) * x[t].astype(np.float64)
    return float(((s32 - s64) ** 2).sum() / (s64 ** 2).sum())


def test_a_states_floor_grows_with_the_rows_it_carried():
    """A recurrent state is a sequential sum over the rows it remembers (scaling.state_width):
    a sound float32 state carried row by row rounds to ~n u^2 / 10 or more, where a
    reference computing it as one blocked reduction is lucky (mamba2, trained weights,
    float32, 256 rows: head 3 at 5.7e-13 against HF's cached path at 7.95e-15, over the
    fixed floor's 4e-13 bound). The floor at the state's width stays over that chain at
    every length; the fixed floor does not (the last assertion: this test fails without
    the scaling). Other probes keep the layer's width: the conv state is a copy, no sum."""
    tol = _float32_table()
    rng = np.random.default_rng(0)
    for n in (256, 1024, 4096):
        e = _recurrence_nmse(n, rng)
        assert e <= scaling.floor_for(tol, scaling.state_width("L0.state_rec", 64, n)), (n, e / U2)
    assert e > 4 * tol["nmse_floor"]  # 4096 rows: past the fixed floor's whole allowance
    assert scaling.state_width("L0.state_rec", 64, 16) == 64 and scaling.state_width("state_conv", 64, 300) == 64
    assert scaling.state_width("L0.rec_out", 64, 4096) == 64 and scaling.state_width("state_rec", None, None) is None


@pytest.mark.parametrize("key, bad, valid", [
    *(("floor_width", b, "valid: a positive number") for b in ("0", "-64", "true", '"64"')),
    *(("score_floor", b, "valid: a number >= 0") for b in ("-1", "true", '"2"')),
])
def test_a_floor_key_that_is_not_a_number_in_range_is_refused_in_one_line(tmp_path, key, bad, valid):
    p = tmp_path / "tol.toml"
    p.write_text(f"[dtype.float32]\ndefault = {{ nmse = 1e-10, atol = 1e-4, {key} = {bad} }}\n")
    with pytest.raises(UsageError) as e:
        load_policy(p)
    msg = str(e.value)
    assert key in msg and valid in msg and "\n" not in msg


# ---------------------------------------------------------------- behind a recurrent output norm
def test_the_residual_floor_carries_the_norms_allowance_diluted_by_the_residual():
    from harness.scaling import residual_floor_scale

    out = np.full((1, 4, 8), 0.5)
    mid = np.full((1, 4, 8), 5.0)  # |attn_out|^2 / |resid_mid|^2 = 0.01
    probes = {"L0.attn_out": out, "L0.resid_mid": mid}
    assert residual_floor_scale(1.0, probes, 0) == 1.0  # nothing amplified: the plain floor
    assert residual_floor_scale(28.0, probes, 0) == 1.0  # diluted below the plain floor
    assert np.isclose(residual_floor_scale(28.0, {"L0.attn_out": out, "L0.resid_mid": out * 2}, 0), 7.0)
    assert residual_floor_scale(28.0, {"L0.attn_out": out}, 0) == 1.0  # nothing to measure


def test_the_fuzz_case_behind_the_norm_passes_at_resid_mid_on_any_blas(policy):
    """qwen3_5_text, 1 head, 3 tokens (fixtures/matrix/fuzz_regressions.toml): L0 resid_mid
    sat at 1.02 of the plain floor on this CI machine's CPU (0.22 on the one it was found
    on): the norm's allowance at attn_out reaches resid_mid, diluted by the residual."""
    from harness.pytest_fixtures import run

    rows = run(policy, family="qwen3_5_text", backend="torch", dtype="float32", kv="decode", schedule="prefill",
               seed=1, tokens=3, ref="hf", overrides=(("num_attention_heads", 1), ("num_key_value_heads", 1)))
    mid = [r for r in rows if r["layer"] == 0 and r["probe"] == "resid_mid" and r["candidate"] == "impl"]
    assert mid and mid[0]["status"] == "pass", mid
    # the bound widened by the allowance, not beyond it: the plain floor is 1e-13 there
    assert 1e-13 < mid[0]["tol_nmse"] < 1e-11, mid[0]["tol_nmse"]


# ---------------------------------------------------------------- behind a softmax
def _attention_probes(c, d=32, h=4, hkv=2, t=12, seed=0, window=None):
    """q_rope / k_rope / attn_probs of one causal attention layer with score scale ``c``
    in float64, the probabilities' float32 twin computed from float32 q and k (scores
    and softmax in float32, as every float32 reference does), and a masked key exactly 0."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, t, h, d))
    k = rng.standard_normal((1, t, hkv, d))
    mask = np.tril(np.ones((t, t), dtype=bool))
    if window:
        mask &= ~np.tril(np.ones((t, t), dtype=bool), -window)

    def probs(q, k, dt):
        kk = np.repeat(k, h // hkv, axis=2)
        s = np.einsum("sthd,sjhd->shtj", q.astype(dt), kk.astype(dt)) * dt(c)
        s = np.where(mask, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).astype(dt)

    return {"L0.q_rope": q, "L0.k_rope": k, "L0.attn_probs": probs(q, k, np.float64)}, probs(q, k, np.float32)


@pytest.mark.parametrize("c", [0.05, 1 / np.sqrt(32), 0.5, 1.0])
def test_the_score_magnitude_predicts_a_sound_float32_softmax(c):
    """A float32 attention's NMSE at attn_probs is ~u^2 M (scaling.score_magnitude) from
    scores of spread 0.3 to 6: the floor 2 u^2 M keeps the same headroom over it at every
    scale -- where the plain floor is passed from scale 1 (gemma4's) on."""
    probes, p32 = _attention_probes(c)
    m = scaling.score_magnitude(probes, 0)
    oracle = probes["L0.attn_probs"]
    nmse = float(((p32 - oracle) ** 2).sum() / (oracle ** 2).sum())
    assert 0.05 < nmse / (U2 * m) < 2.0, (c, m, nmse / U2)
    assert nmse * 2 < 2.0 * U2 * m or nmse < 1e-13


def test_the_score_magnitude_fits_the_scale_and_reads_groups_and_masks():
    """The scale between q . k and the scores is fitted from the run (nothing reads a
    family's formula): M grows as c^2, through grouped key heads and a sliding window;
    shapes that do not meet, or a missing probe, give None (the plain floor)."""
    for c in (0.1, 0.7):
        probes, _ = _attention_probes(c, window=4)
        q, k, p = probes["L0.q_rope"], np.repeat(probes["L0.k_rope"], 2, axis=2), probes["L0.attn_probs"]
        q2 = (q ** 2).sum(-1).transpose(0, 2, 1)[..., None]
        k2 = (k ** 2).sum(-1).transpose(0, 2, 1)[:, :, None, :]
        p2 = (p ** 2).sum(-1, keepdims=True)
        known = (p * p * (1 - 2 * p + p2) * c * c * q2 * k2).sum() / p2.sum()  # the formula at the true scale
        assert scaling.score_magnitude(probes, 0) == pytest.approx(known, rel=1e-9), c
    probes, _ = _attention_probes(0.2)
    assert scaling.score_magnitude({k: v for k, v in probes.items() if "k_rope" not in k}, 0) is None
    assert scaling.score_magnitude(dict(probes, **{"L0.k_rope": probes["L0.k_rope"][:, :5]}), 0) is None
    one = dict(probes, **{"L0.attn_probs": np.eye(12)[None, None].repeat(4, axis=1)})  # one key takes all
    assert scaling.score_magnitude(one, 0) is None  # no spread to fit a scale on


def test_the_judge_raises_the_floor_by_the_score_magnitude_and_a_bug_still_fails():
    """The gemma4 fuzz false alarm in numbers (L1 attn_probs, M 109: HF 1.5e-13 and impl
    6.2e-13 from the oracle, plain bound 6e-13): passes under the score floor; a bug 10x
    over a sound result there still fails, and a family of M 6 keeps the plain floor."""
    from harness.pipeline.judge import Judge, JudgeRequest
    from impl import LayerConfig

    lc = LayerConfig(hidden_size=64, n_heads=1, n_kv_heads=1, head_dim=32)
    req = JudgeRequest(case=None, family="gemma4", config=None, layer_cfgs=(lc,), policy=load_policy(None),
                       selection=None, features=(), variant=None, candidate="impl", teacher_forced=True,
                       weight_dtype="f32")
    rng = np.random.default_rng(0)
    oracle = rng.random((1, 1, 5, 5))

    def side(nmse, seed):
        d = np.random.default_rng(seed).standard_normal(oracle.shape)
        return oracle + d * np.sqrt(nmse * (oracle ** 2).sum() / (d ** 2).sum())

    from harness.case import Case

    req = JudgeRequest(**{**req.__dict__, "case": Case(family="gemma4", backend="torch", tokens=5)})
    j = Judge(req)

    def status(cand, m):
        row = j.judge("impl", "hf", 0, "attn_probs", side(cand, 1), side(1.5e-13, 2), "float32", oracle,
                      score_mag=m)
        return row["status"], row["tol_nmse"]

    assert status(6.2e-13, None)[0] == "fail"  # the plain floor: the false alarm
    assert status(6.2e-13, 109.0) == ("pass", pytest.approx(4 * 2 * U2 * 109))
    assert status(2 * 2.5 * 10 * U2 * 109, 109.0)[0] == "fail"  # 10x the worst sound result measured
    assert status(6.2e-13, 6.0)[0] == "fail"  # M 6 (llama): 2 u^2 M < 1e-13, the plain floor stands
