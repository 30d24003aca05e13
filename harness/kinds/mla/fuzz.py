"""The MLA kind's spec examples (harness/fuzz.py ``spec_strategy``): an MLA layer
of either form, direct or low-rank Q, YaRN on or off, the output gate no HF
family has -- and its seeded weights."""

from __future__ import annotations

import math

import numpy as np

from impl import MlaConfig, NormSpec, make_rope, mla_yarn


def spec_strategy(st, n: int, hid: int, opts: dict):
    """A hypothesis strategy of one ``MlaConfig`` at width ``hid`` (the MLA gate has no HF family: only here)."""
    opts["mla"] = True

    @st.composite
    def draw(draw):
        h = draw(st.integers(1, 4))
        rd = draw(st.sampled_from((0, 2, 4)))
        rope = make_rope("default", 10000.0, rd, "interleaved") if rd else None
        yarn = None
        if rope is not None and draw(st.booleans()):
            yarn = mla_yarn(rope, {"factor": 4.0, "original_max_position_embeddings": 16,
                                              "max_position_embeddings": 64, "mscale": 1.0,
                                              "mscale_all_dim": draw(st.sampled_from((0.707, 1.0)))},
                                       draw(st.sampled_from((1.0, 1.1))))
        return MlaConfig(hidden_size=hid, n_heads=h, kv_lora_rank=draw(st.sampled_from((4, 8))),
                         qk_nope_head_dim=draw(st.sampled_from((2, 4))), qk_rope_head_dim=rd,
                         v_head_dim=draw(st.sampled_from((2, 4, 6))), q_lora_rank=draw(st.sampled_from((None, 4))),
                         input_norm=NormSpec("rms", 1e-6), rope=rope, yarn=yarn,
                         form=draw(st.sampled_from(("naive", "absorbed"))), use_output_gate=draw(st.booleans()),
                         residual=draw(st.sampled_from(("sequential", "parallel"))))

    return draw()


def spec_weights(cfg, opts: dict, rng) -> dict:
    """Seeded float64 weights of an MLA layer, in the form's own tensors."""
    hid = cfg.hidden_size

    def mat(o, i):
        return rng.standard_normal((o, i)) / math.sqrt(i)

    def vec(k, around=0.0, s=0.1):
        return around + s * rng.standard_normal(k)

    w = {}
    h, r, nope, rd, dv = cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    w.update(attn_norm=vec(hid, 1.0), wkv_a=mat(r + rd, hid), kv_a_norm=vec(r, 1.0), wo=mat(hid, h * dv))
    if cfg.q_lora_rank is None:
        w["wq"] = mat(h * (nope + rd), hid)
    else:
        w.update(wq_a=mat(cfg.q_lora_rank, hid), q_a_norm=vec(cfg.q_lora_rank, 1.0),
                 wq_b=mat(h * (nope + rd), cfg.q_lora_rank))
    kvb = mat(h * (nope + dv), r)
    if cfg.form == "naive":
        w["wkv_b"] = kvb
    else:
        kv3 = kvb.reshape(h, nope + dv, r)
        w.update(wk_b=np.ascontiguousarray(kv3[:, :nope].transpose(0, 2, 1)), wv_b=np.ascontiguousarray(kv3[:, nope:]))
    if cfg.use_output_gate:
        w["wg"] = mat(h * dv, hid)
    return w
