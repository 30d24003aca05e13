"""impl.mla on its own: the two forms agree, prefill and decode agree, every KV
backing holds what its form says, the output gate does what the spec writes,
and the mla-cache figure measures what impl holds."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mutants import applied
from harness.kinds.mla.mutants import GATE_MUTANTS
from impl import Backend, MlaConfig, NormSpec, kq_scale, make_rope, mla_yarn
from impl.config import ConfigError
from harness.schedule import chunk_sizes
from impl.runner import load_layer, run_layer
from impl.trace import LAYER_PROBES
from harness.features import layer_features

H, HID, R, NOPE, ROPE, V, QL = 4, 64, 24, 12, 8, 10, 16
SHARED_PROBES = ("attn_in", "q_latent", "q", "kv_latent", "q_pe", "k_pe", "q_rope", "attn_probs", "attn_heads",
                 "attn_branch", "attn_out", "resid_mid")


YARN_PARAMS = dict(factor=4.0, original_max_position_embeddings=128, mscale=1.0, mscale_all_dim=0.707,
                   max_position_embeddings=512)


def _rope():
    return make_rope("default", 10000.0, ROPE, "interleaved")


def _yarn(mscale=1.07):
    return mla_yarn(_rope(), YARN_PARAMS, mscale)


def _weights(seed=0, gate=False):
    rng = np.random.default_rng(seed)
    kvb = rng.standard_normal((H * (NOPE + V), R)) / 5
    kv3 = kvb.reshape(H, NOPE + V, R)
    w = dict(attn_norm=1 + 0.1 * rng.standard_normal(HID), wq_a=rng.standard_normal((QL, HID)) / 8,
             q_a_norm=1 + 0.1 * rng.standard_normal(QL), wq_b=rng.standard_normal((H * (NOPE + ROPE), QL)) / 4,
             wkv_a=rng.standard_normal((R + ROPE, HID)) / 8, kv_a_norm=1 + 0.1 * rng.standard_normal(R),
             wkv_b=kvb, wk_b=kv3[:, :NOPE].transpose(0, 2, 1).copy(), wv_b=kv3[:, NOPE:].copy(),
             wo=rng.standard_normal((HID, H * V)) / 6)
    if gate:
        w["wg"] = rng.standard_normal((H * V, HID)) / 8
    return w


def _cfg(form="absorbed", gate=False, rope=True):
    return MlaConfig(hidden_size=HID, n_heads=H, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
                     v_head_dim=V, q_lora_rank=QL, input_norm=NormSpec("rms", 1e-6),
                     rope=_rope() if rope else None, yarn=_yarn() if rope else None, form=form,
                     use_output_gate=gate)


def _inputs(n_seq, tokens=11, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((tokens, HID)) for _ in range(n_seq)]


def _run(cfg, w, backend, kv="decode", schedule="prefill", n_seq=1):
    layer = load_layer(cfg, w, backend)
    inputs = _inputs(n_seq)
    outs, traces, steps = run_layer(layer, inputs, kv, [chunk_sizes(schedule, len(x)) for x in inputs])
    return layer, outs, [t.assemble() for t in traces], steps


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("backend,tol", [(Backend("numpy", "cpu", "float64"), 1e-12),
                                         (Backend("torch", "cpu", "float32"), 2e-6)])
def test_naive_equals_absorbed(backend, tol):
    _, _, naive, _ = _run(_cfg("naive"), _weights(), backend)
    _, _, absorbed, _ = _run(_cfg("absorbed"), _weights(), backend)
    for p in SHARED_PROBES:
        assert _rel(naive[0][p], absorbed[0][p]) < tol, p
    # what exists in one form only
    assert "k_rope" in naive[0] and "q_absorbed" not in naive[0]
    assert "q_absorbed" in absorbed[0] and "k_rope" not in absorbed[0]


@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_prefill_equals_decode_in_every_kv_mode(form):
    be = Backend("numpy", "cpu", "float64")
    _, ref, _, _ = _run(_cfg(form), _weights(), be, "decode", "prefill", 1)
    for kv in ("decode", "batched", "paged"):
        for schedule in ("prefill", "decode", "mixed", "3,1,5,2"):
            n_seq = 1 if kv == "decode" else 2
            _, outs, _, _ = _run(_cfg(form), _weights(), be, kv, schedule, n_seq)
            assert _rel(outs[0], ref[0]) < 1e-12, (kv, schedule)
            if n_seq == 2:  # the second sequence is its own, not a copy of the first
                assert _rel(outs[1], outs[0]) > 1e-3


def test_the_cache_holds_what_the_form_says():
    be = Backend("numpy", "cpu", "float32")
    naive, _, _, steps_n = _run(_cfg("naive"), _weights(), be)
    absorbed, _, _, steps_a = _run(_cfg("absorbed"), _weights(), be)
    assert naive.kv_row_shapes() == ((H, NOPE + ROPE), (H, V))
    assert absorbed.kv_row_shapes() == ((R + ROPE,), None)
    cn, ca = steps_n[0].cache, steps_a[0].cache
    assert ca.v is None and tuple(ca.k.shape) == (11, R + ROPE)
    assert cn.nbytes() == 11 * 4 * H * (NOPE + ROPE + V) and ca.nbytes() == 11 * 4 * (R + ROPE)
    # the absorbed layer does not hold the combined kv_b, the naive one not k_b / v_b
    assert "wkv_b" not in absorbed.w and {"wk_b", "wv_b"} <= set(absorbed.w)
    assert "wkv_b" in naive.w and not {"wk_b", "wv_b"} & set(naive.w)
    _, _, _, steps_p = _run(_cfg("absorbed"), _weights(), be, "paged", "mixed", 2)
    assert steps_p[0].pool.v is None and steps_p[0].pool.nbytes_per_row() == 4 * (R + ROPE)


def test_kq_scale_is_the_unabsorbed_width_with_mscale_squared():
    cfg = _cfg()
    assert kq_scale(cfg) == pytest.approx(1.07**2 / np.sqrt(NOPE + ROPE))
    assert kq_scale(cfg.replace(yarn=None)) == pytest.approx(1 / np.sqrt(NOPE + ROPE))
    assert layer_features(cfg) == {"mla", "mla_absorbed", "mla_low_rank_q", "mla_rope", "mla_yarn"}
    assert layer_features(_cfg("naive", gate=True, rope=False)) == {"mla", "mla_naive", "mla_low_rank_q", "mla_gate"}


def test_shared_k_rot_is_rotated_once_at_its_position():
    """Spec: rotating the shared k_rot once then broadcasting equals rotating every
    head's copy -- the naive form's per-head K carries the same rope slice on every head."""
    _, _, tr, _ = _run(_cfg("naive"), _weights(), Backend("numpy", "cpu", "float64"), "decode", "mixed")
    k = tr[0]["k_rope"]
    for h in range(H):
        np.testing.assert_array_equal(k[:, h, NOPE:], tr[0]["k_pe"])


def test_refuses_impossible_layers():
    with pytest.raises(ConfigError, match="rotates 8 channels"):
        MlaConfig(hidden_size=HID, n_heads=H, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=6,
                  v_head_dim=V, rope=_rope())
    with pytest.raises(ConfigError, match="valid: naive, absorbed"):
        _cfg("latent")
    # the spec's MLA rotates in interleaved pairs (rotate_pe: apply_rope_interleaved); MiniCPM3
    # rotate-half (minicpm3.cpp NEOX, HF MiniCPM3Attention apply_rotary_pos_emb): both accepted,
    # and they are different rotations of the same slice
    neox = _cfg().replace(rope=make_rope("default", 10000.0, ROPE, "neox"))
    assert neox.rope.layout == "neox"
    w = _weights()
    be = Backend("numpy", "cpu", "float64")
    assert not np.allclose(_run(neox, w, be, "decode", "prefill")[2][0]["q_pe"],
                           _run(_cfg(), w, be, "decode", "prefill")[2][0]["q_pe"])
    # YaRN is ONE setting (spec `yarn` argument): not smuggled in through the rotation ...
    with pytest.raises(ConfigError, match="YaRN is MlaConfig.yarn"):
        _cfg().replace(rope=make_rope("yarn", 10000.0, ROPE, "interleaved", YARN_PARAMS), yarn=None)
    # ... and never without the rotation it scales
    with pytest.raises(ConfigError, match="YaRN without RoPE"):
        _cfg(rope=False).replace(yarn=_yarn())
    w = _weights()
    del w["wk_b"]
    with pytest.raises(ConfigError, match="lacks weight 'wk_b'"):
        load_layer(_cfg("absorbed"), w, Backend())
    load_layer(_cfg("naive"), w, Backend())  # the naive form does not read k_b
    with pytest.raises(ConfigError, match="use_output_gate is off"):
        load_layer(_cfg(), _weights(gate=True), Backend())


# ---------------------------------------------------------------- the output gate

def _gate_first_failure() -> str | None:
    """impl's gated layer against the spec's gate (mla_forward_token: ``attn_out *
    sigmoid(g_proj(hidden))``, ``hidden`` being what Q and KV are projected from,
    the normed input), computed here from the ungated layer's own probes. Returns
    the first probe (dataflow order) where they differ, or None."""
    be = Backend("numpy", "cpu", "float64")
    w = _weights(gate=True)
    _, _, gated, _ = _run(_cfg(gate=True), w, be, "decode", "mixed")
    _, _, plain, _ = _run(_cfg(gate=False), {k: v for k, v in w.items() if k != "wg"}, be, "decode", "mixed")
    g, p = gated[0], plain[0]
    n = g["attn_in"].shape[0]
    gate = 1.0 / (1.0 + np.exp(-(p["attn_in"] @ w["wg"].T)))
    expect = {**p, "attn_branch": p["attn_heads"].reshape(n, H * V) * gate}
    expect["attn_out"] = expect["attn_branch"] @ w["wo"].T
    expect["resid_mid"] = p["layer_in"] + expect["attn_out"]
    for probe in LAYER_PROBES:
        if probe in g and not np.allclose(g[probe], expect[probe], rtol=1e-10, atol=1e-12):
            return probe
    return None


def test_output_gate_is_the_specs():
    assert _gate_first_failure() is None


@pytest.mark.parametrize("mutant", GATE_MUTANTS, ids=lambda m: m.name)
def test_gate_mutants_are_caught_at_their_probe(mutant):
    with applied(mutant):
        assert _gate_first_failure() == mutant.first_probe


# ---------------------------------------------------------------- the figure

def test_mla_cache_figure(tmp_path):
    from harness.commands import mla_cache

    rows = mla_cache.run(tmp_path, ["deepseek_v2"], tokens=5)
    assert (tmp_path / "mla_cache.csv").is_file() and (tmp_path / "deepseek_v2.png").stat().st_size > 1000
    assert {(r["form"], r["kv"]) for r in rows} == {(f, k) for f in ("naive", "absorbed")
                                                    for k in ("decode", "batched", "paged")}
    for r in rows:  # measured from the caches == what the form's rows hold
        assert r["bytes_per_token"] == r["formula_bytes_per_token"], r
    by = {(r["form"], r["kv"]): r["bytes_per_token"] for r in rows}
    # deepseek_v2 tiny: 3 MLA layers, float32; naive 4 heads x (20 + 10), absorbed 24 + 8
    assert by[("naive", "decode")] == 3 * 4 * 4 * 30 and by[("absorbed", "decode")] == 3 * 4 * 32
    assert "deepseek_v2" in mla_cache.table(rows)


def test_mla_cache_refuses_a_non_mla_family(tmp_path):
    from harness.commands import mla_cache
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="not an MLA family: llama"):
        mla_cache.run(tmp_path, ["llama"])


# ---------------------------------------------------------------- YaRN, one setting

def test_yarn_reaches_the_rotation_and_the_scale_together():
    """Spec mla_forward_token's ``yarn``: the pe bands divided by its factors, q_pe /
    k_pe multiplied by its magnitude after the rotation, the softmax scale its
    kq_scale -- written here from the spec (complex rotation of interleaved pairs),
    against impl's probes."""
    be = Backend("numpy", "cpu", "float64")
    yarn = _yarn()
    _, _, tr, _ = _run(_cfg("absorbed"), _weights(), be, "decode", "mixed")
    _, _, plain, _ = _run(_cfg("absorbed").replace(yarn=None), _weights(), be, "decode", "mixed")
    p = plain[0]
    # the unrotated slice, recovered from the plain run by rotating back at the plain bands
    inv_plain = np.asarray(_rope().inv_freq)
    inv_yarn = inv_plain / np.asarray(yarn.freq_factors)
    pos = np.arange(p["k_pe"].shape[0])

    def rot(x, inv, sign):
        z = x[..., 0::2] + 1j * x[..., 1::2]
        z = z * np.exp(sign * 1j * pos[:, None] * inv[None, :]).reshape((len(pos),) + (1,) * (x.ndim - 2) + (-1,))
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    raw_k = rot(p["k_pe"], inv_plain, -1)
    want = rot(raw_k, inv_yarn, +1) * yarn.pe_magnitude
    np.testing.assert_allclose(tr[0]["k_pe"], want, rtol=1e-10, atol=1e-12)
    raw_q = rot(p["q_pe"], inv_plain, -1)
    np.testing.assert_allclose(tr[0]["q_pe"], rot(raw_q, inv_yarn, +1) * yarn.pe_magnitude, rtol=1e-10, atol=1e-12)
    assert kq_scale(_cfg()) == pytest.approx(yarn.mscale**2 / np.sqrt(NOPE + ROPE))
    assert yarn.pe_magnitude != 1.0 and not np.allclose(yarn.freq_factors, 1.0)  # both halves act here
