"""The attention kind's spec examples (harness/fuzz.py ``spec_strategy``): one
layer outside what any reference family can say -- both gates on one layer, a
sub-norm after a gate, ALiBi with a window and sinks, a QK norm after RoPE with
a temperature, a linear or absent layer -- drawn with hypothesis, and its seeded
weights. Every decoration's "on" is away from where hypothesis shrinks (0,
False, the first choice), so a shrunk failure keeps only the decorations it needs."""

from __future__ import annotations

import math

from contract.errors import ConfigError
from impl import LayerConfig, NormSpec, QkNormSpec, TemperatureSpec, WindowSpec, make_rope
from harness.lazy import lazy

hypothesis = lazy("hypothesis")


def _divisor(draw, st, n: int) -> int:
    return draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))


def spec_strategy(st, n: int, hid: int, opts: dict):
    """A hypothesis strategy of one ``LayerConfig`` for ``n`` tokens at width ``hid``;
    ``opts`` receives the weight options it draws (biases, sinks, ...)."""
    @st.composite
    def draw_cfg(draw):
        norm_kinds = ("rms", "rms1p", "layer", "none")
        shape = draw(st.sampled_from(("gqa",) * 8 + ("linear", "absent")))
        if shape != "gqa":
            return LayerConfig(hidden_size=hid, shape=shape, input_norm=NormSpec(draw(st.sampled_from(norm_kinds)), 1e-5))
        h = draw(st.integers(1, 6))
        hkv = _divisor(draw, st, h)
        d = draw(st.sampled_from((2, 4, 6, 8)))
        gate_i = draw(st.booleans())
        dv = None if gate_i else draw(st.sampled_from((None, 2, 4, 6)))
        rope = None
        alibi = None
        if draw(st.integers(0, 4)) == 4:
            alibi = draw(st.sampled_from((8.0, 4.0)))
        elif draw(st.integers(0, 5)):
            rot = draw(st.sampled_from([r for r in (2, 4, 6, 8) if r <= d]))
            kind = draw(st.sampled_from(("default", "linear", "llama3", "yarn")))
            p = {}
            if kind != "default":
                p["factor"] = draw(st.sampled_from((2.0, 4.0)))
            if kind in ("llama3", "yarn"):
                p["original_max_position_embeddings"] = 16
            if kind == "llama3":
                p.update(low_freq_factor=1.0, high_freq_factor=4.0)
            if kind == "default" and draw(st.integers(0, 3)) == 3:
                # LongRoPE: the bands divided by a factor set (freq_factors)
                kind = "longrope"
                p.update(original_max_position_embeddings=16, max_position_embeddings=64,
                         short_factor=[1.0 + 0.5 * i for i in range(rot // 2)],
                         long_factor=[2.0 + i for i in range(rot // 2)],
                         which=draw(st.sampled_from(("short", "long"))))
            rope = make_rope(kind, draw(st.sampled_from((100.0, 10000.0))), rot,
                             draw(st.sampled_from(("neox", "interleaved"))), p)
        window = None
        if draw(st.booleans()):
            window = WindowSpec(draw(st.sampled_from(("sliding", "chunked"))), draw(st.integers(1, n + 2)))
        qk = None
        if draw(st.booleans()):
            where = draw(st.sampled_from(("pre_rope", "post_rope")))
            kind = ("l2" if where == "post_rope" and draw(st.booleans())
                    else draw(st.sampled_from(("rms", "rms1p", "layer"))))
            over = draw(st.sampled_from(("head", "row")))
            qk = QkNormSpec(NormSpec(kind, 1e-6), over, where,
                            per_head=over == "head" and kind != "l2" and draw(st.booleans()))
        clamp = draw(st.sampled_from((None, None, 0.5)))
        clamp_at = "qk_norm" if clamp and qk is not None and qk.where == "pre_rope" and draw(st.booleans()) else "bias"
        gate = draw(st.booleans())
        try:
            cfg = LayerConfig(
                hidden_size=hid, n_heads=h, n_kv_heads=hkv, head_dim=d, v_head_dim=dv,
                input_norm=NormSpec(draw(st.sampled_from(norm_kinds)), 1e-5),
                qkv_clamp=clamp, qkv_clamp_at=clamp_at, qk_norm=qk, rope=rope,
                v_norm=NormSpec("l2", 1e-6) if draw(st.integers(0, 4)) == 4 else None,
                scale=draw(st.sampled_from((None, None, 0.3))),
                temperature=(TemperatureSpec(2.0, 0.3, draw(st.sampled_from((1, 0))))
                             if draw(st.integers(0, 4)) == 4 else None),
                window=window, softcap=draw(st.sampled_from((None, None, 1.5, 20.0))), alibi_max_bias=alibi,
                q_gate_interleaved=gate_i, output_gate=gate,
                output_gate_fn=draw(st.sampled_from(("sigmoid", "softplus"))) if gate else "sigmoid",
                output_gate_per_head=gate and draw(st.booleans()),
                sub_norm=NormSpec("rms", 1e-5) if draw(st.booleans()) else None,
                o_scale=draw(st.sampled_from((None, 0.5))), value_scale=draw(st.sampled_from((None, 1.5))),
                post_norm=NormSpec(draw(st.sampled_from(("rms", "rms1p"))), 1e-6) if draw(st.booleans()) else None,
                residual=draw(st.sampled_from(("sequential", "parallel"))),
                residual_multiplier=draw(st.sampled_from((1.0, 1.0, 0.5))))
        except ConfigError:

            hypothesis.assume(False)
        opts.update(biases=draw(st.booleans()), sinks=draw(st.booleans()), obias=draw(st.booleans()),
                    gate_bias=draw(st.booleans()), qk_norm_bias=draw(st.booleans()))
        return cfg

    return draw_cfg()


def spec_weights(cfg, opts: dict, rng) -> dict:
    """Seeded float64 weights of an attention layer: every optional one ``opts`` switches on."""
    hid = cfg.hidden_size

    def mat(o, i):
        return rng.standard_normal((o, i)) / math.sqrt(i)

    def vec(k, around=0.0, s=0.1):
        return around + s * rng.standard_normal(k)

    w = {}
    if cfg.shape == "absent":
        return w
    if cfg.input_norm.kind != "none":
        w["attn_norm"] = vec(hid, 1.0)
        if cfg.input_norm.kind == "layer":
            w["attn_norm_b"] = vec(hid)
    if cfg.shape == "linear":
        w["wo"] = mat(hid, hid)
        return w
    h, hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    w.update(wq=mat(h * d * (2 if cfg.q_gate_interleaved else 1), hid), wk=mat(hkv * d, hid), wv=mat(hkv * dv, hid),
             wo=mat(hid, h * dv))
    if opts.get("biases"):
        w.update(bq=vec(h * d), bk=vec(hkv * d), bv=vec(hkv * dv))
        if cfg.q_gate_interleaved:
            w["bq_gate"] = vec(h * d)
    if opts.get("sinks"):
        w["sinks"] = vec(h, 0.0, 1.0)
    if opts.get("obias"):
        w["bo"] = vec(hid)
    if cfg.output_gate:
        g = h if cfg.output_gate_per_head else h * dv
        w["wg"] = mat(g, hid)
        if opts.get("gate_bias"):
            w["bg"] = vec(g)
    if cfg.qk_norm is not None and cfg.qk_norm.norm.kind != "l2":
        row = cfg.qk_norm.over == "row"
        around = 0.0 if cfg.qk_norm.norm.kind == "rms1p" else 1.0
        qs, ks = (h * d, hkv * d) if row else ((h, d), (hkv, d)) if cfg.qk_norm.per_head else (d, d)
        w.update(q_norm=vec(qs, around), k_norm=vec(ks, around))
        if cfg.qk_norm.norm.kind == "layer" and opts.get("qk_norm_bias"):
            w.update(q_norm_b=vec(qs), k_norm_b=vec(ks))
    if cfg.sub_norm is not None:
        w["sub_norm"] = vec(h * dv, 1.0)
    if cfg.post_norm is not None:
        w["post_norm"] = vec(hid, 0.0 if cfg.post_norm.kind == "rms1p" else 1.0)
    return w
