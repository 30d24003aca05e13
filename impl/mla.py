"""DeepSeek-style multi-head latent attention (MLA), written once.

The second half of the specification (``spec/mla.rs.txt``, ``mla_forward_token``)
with its own body, ``mla_block``, for every caller: prefill and decode, every KV
backing (``impl.kv``: Decode / Batched / Paged hold the layer's cache rows),
NumPy and torch, every dtype. In dataflow order:

  input norm -> Q: low-rank (``q_a``, its RMS norm, ``q_b``) or direct (``q``)
  -> ``kv_a_proj_with_mqa``: the latent ``c`` plus ONE shared rope slice
  ``k_pe`` -> ``kv_a_layernorm`` on ``c`` only -> RoPE of the decoupled slices
  (``q_pe`` per head, the shared ``k_pe`` rotated once, before any broadcast;
  YaRN's per-band frequencies, then its magnitude on the rotated channels)
  -> the FORM (``MlaConfig.form``, the spec's ``MlaKvB``):

  - ``naive`` (``MlaKvB::Combined``): the combined ``kv_b`` expands ``c`` into
    per-head ``k_nope`` and ``v``; K = ``[k_nope | k_pe]`` per head; the cache
    holds per-head K ``[H, nope + rope]`` and V ``[H, v]`` per position.
  - ``absorbed`` (``MlaKvB::Split``): ``q_nope`` is absorbed through ``k_b``
    into the latent space; attention is MQA over the latent cache row
    ``[c | k_pe]`` (``kv_lora_rank + rope`` wide, one row per position, no V
    cache: V is the first ``kv_lora_rank`` channels of the same row,
    llama-graph.cpp ``build_attn``'s offset-0 view); the weighted latent goes
    through ``v_b`` per head.

  -> ONE attention kernel for both forms -- the GQA body's own
  (``impl.attention.attend``: scores, causal mask, one softmax; the absorbed
  form is its MQA case) with the softmax scale
  ``kq_scale`` = ``mscale^2 / sqrt(qk_nope + qk_rope)`` -- the UNabsorbed head
  width in both forms -> optional sigmoid output gate (``g_proj`` of the
  normed input) -> ``o_proj`` -> residual.

The two forms compute the same attention with different memory; the tests
hold them to each other within rounding.

Canonical probes recorded (``impl.trace.LAYER_PROBES``): ``attn_in``,
``q_latent`` (low-rank Q only: the normed ``q_a`` output), ``q`` (``q_b`` /
``q`` output, ``[T, H, nope + rope]``, before RoPE), ``kv_latent`` (the normed
``c``, ``[T, kv_lora_rank]``), ``q_pe`` (``[T, H, rope]``) and ``k_pe``
(``[T, rope]``) after RoPE, ``q_rope`` (the unabsorbed query after RoPE,
``[T, H, nope + rope]``), ``k_rope`` (naive only: per-head K after RoPE),
``q_absorbed`` (absorbed only: ``[T, H, kv_lora_rank + rope]``), ``attn_probs``,
``attn_heads`` (``[T, H, v]``, before the gate), ``attn_branch`` (what enters
``o_proj``), ``attn_out``, ``resid_mid``. The rope slices are in the
INTERLEAVED channel order the rotation works in (pairs ``(2i, 2i+1)``, ggml
``ROPE_TYPE_NORM``, spec ``apply_rope_interleaved``); a reference that returns
them de-interleaved is brought to this order by its family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from contract.layers import MLA_FORMS, MlaConfig, MlaForm, MlaYarn  # noqa: F401 (re-exported)

from . import kv as kvmod
from . import rope as ropemod
from .backend import Backend
from .config import ConfigError, RopeSpec
from .attention import attend, temper
from .norms import normalize
from .ops import linear as _linear
from .ops import noop as _noop
from .ops import sigmoid as _sigmoid


# The weights an MLA layer may carry, in HF nn.Linear layout ([out, in]).
MLA_WEIGHTS = {
    "attn_norm": "input norm weight [hidden]",
    "wq": "direct Q [H * (nope + rope), hidden] (q_lora_rank None)",
    "wq_a": "low-rank Q down-projection [q_lora_rank, hidden]",
    "bq_a": "its bias [q_lora_rank] (HF attention_bias)",
    "q_a_norm": "RMS weight of the Q latent [q_lora_rank]",
    "wq_b": "low-rank Q up-projection [H * (nope + rope), q_lora_rank]",
    "wkv_a": "kv_a_proj_with_mqa [kv_lora_rank + rope, hidden]",
    "bkv_a": "its bias [kv_lora_rank + rope] (HF attention_bias)",
    "kv_a_norm": "RMS weight of the KV latent [kv_lora_rank]",
    "wkv_b": "naive form: combined kv_b [H * (nope + v), kv_lora_rank]",
    "wk_b": "absorbed form: k_b [H, kv_lora_rank, nope] (the absorb direction, llama.cpp attn_k_b)",
    "wv_b": "absorbed form: v_b [H, v, kv_lora_rank] (llama.cpp attn_v_b)",
    "wg": "output gate g_proj [H * v, hidden] (use_output_gate)",
    "wo": "o_proj [hidden, H * v]",
    "bo": "o_proj bias [hidden]",
}
# what each form reads of the KV decompression; the other set, if given, is not held
_FORM_WEIGHTS = {"naive": ("wkv_b",), "absorbed": ("wk_b", "wv_b")}


def mla_yarn(rope: RopeSpec, params: dict, mscale: float = 1.0) -> MlaYarn:
    """YaRN over ``rope``'s plain bands from HF ``rope_parameters`` (impl.rope's
    ``_compute_yarn_parameters`` mirror): the per-band divisors and the
    magnitude; ``mscale`` is the softmax half, which the family reads."""
    inv, magnitude = ropemod.inverse_frequencies("yarn", rope.theta, rope.rotary_dim, params)
    factors = tuple(float(b / y) for b, y in zip(rope.inv_freq, inv))
    return MlaYarn(freq_factors=factors, pe_magnitude=float(magnitude), mscale=float(mscale))


def kq_scale(cfg: MlaConfig) -> float:
    """The softmax scale of BOTH forms (spec ``kq_scale(yarn, q_head_dim)``,
    llama.cpp deepseek2.cpp ``mscale * mscale / sqrtf(n_embd_head_k)`` with
    ``n_embd_head_k = n_embd_head_k_mla`` = nope + rope): the UNabsorbed head
    width, even though the absorbed form's dot products run over
    ``kv_lora_rank + rope`` channels -- they are the same dot products."""
    mscale = 1.0 if cfg.yarn is None else cfg.yarn.mscale
    return mscale**2 / math.sqrt(cfg.qk_head_dim)


def _expected_shapes(cfg: MlaConfig) -> dict[str, tuple]:
    h, hid = cfg.n_heads, cfg.hidden_size
    exp = {
        "wkv_a": (cfg.latent_width, hid),
        "kv_a_norm": (cfg.kv_lora_rank,),
        "wo": (hid, h * cfg.v_head_dim),
    }
    if cfg.q_lora_rank is None:
        exp["wq"] = (h * cfg.qk_head_dim, hid)
    else:
        exp.update(wq_a=(cfg.q_lora_rank, hid), q_a_norm=(cfg.q_lora_rank,), wq_b=(h * cfg.qk_head_dim, cfg.q_lora_rank))
    if cfg.form == "naive":
        exp["wkv_b"] = (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    else:
        exp.update(wk_b=(h, cfg.kv_lora_rank, cfg.qk_nope_head_dim), wv_b=(h, cfg.v_head_dim, cfg.kv_lora_rank))
    if cfg.use_output_gate:
        exp["wg"] = (h * cfg.v_head_dim, hid)
    return exp


@dataclass
class MlaLayer:
    """An MLA layer's config and its weights, resident on one backend; implements
    the runner's layer protocol (``block``, ``has_kv``, ``kv_row_shapes``)."""

    cfg: MlaConfig
    backend: Backend
    w: dict = field(default_factory=dict)

    @classmethod
    def load(cls, cfg: MlaConfig, weights: dict, backend: Backend) -> "MlaLayer":
        unknown = set(weights) - set(MLA_WEIGHTS)
        if unknown:
            raise ConfigError(f"unknown MLA weights {sorted(unknown)}; valid: {', '.join(MLA_WEIGHTS)}")
        for name, shape in _expected_shapes(cfg).items():
            if weights.get(name) is None:
                raise ConfigError(f"MLA layer ({cfg.form} form) lacks weight {name!r} {shape}")
            got = tuple(np.shape(weights[name]))
            if got != shape:
                raise ConfigError(f"MLA weight {name} has shape {got}, expected {shape}")
        if "wg" in weights and not cfg.use_output_gate:
            raise ConfigError("MLA weights carry an output gate 'wg' but use_output_gate is off")
        # The KV decompression the OTHER form reads is not held: a form's resident
        # weights (and its cache) are exactly what that form computes with.
        other = set(_FORM_WEIGHTS["absorbed" if cfg.form == "naive" else "naive"])
        w = {k: backend.asarray(v) for k, v in weights.items() if v is not None and k not in other}
        return cls(cfg, backend, w)

    def block(self, x, kv, trace=None):
        return mla_block(self, x, kv, trace)

    def has_kv(self) -> bool:
        return True

    def kv_row_shapes(self) -> tuple[tuple, tuple | None]:
        """One position's cache row(s): per-head K and V (naive), or the one latent
        row ``[kv_lora_rank + rope]`` with no V (absorbed)."""
        c = self.cfg
        if c.form == "naive":
            return (c.n_heads, c.qk_head_dim), (c.n_heads, c.v_head_dim)
        return (c.latent_width,), None


def mla_block(layer: MlaLayer, x, kv: kvmod.KvStep, trace=None):
    """Run ``x[n, hidden]`` (one sequence's rows) through one MLA layer.

    Returns ``(branch, resid_mid)`` like ``impl.attention.attn_block``."""
    cfg, be = layer.cfg, layer.backend
    xp, w = be.xp, layer.w
    put = trace.put if trace is not None else _noop
    n = x.shape[0]
    h, nope, rope_d, r = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank

    put("layer_in", x)
    normed = normalize(xp, x, cfg.input_norm, w.get("attn_norm"), None, be.acc_dtype)
    put("attn_in", normed)

    # Q: direct, or low-rank through a normed latent (spec MlaQProj).
    if cfg.q_lora_rank is None:
        q = _linear(xp, normed, w["wq"], None)
    else:
        q_lat = normalize(xp, _linear(xp, normed, w["wq_a"], w.get("bq_a")), cfg.q_a_norm, w["q_a_norm"], None,
                          be.acc_dtype)
        put("q_latent", q_lat)
        q = _linear(xp, q_lat, w["wq_b"], None)
    q = xp.reshape(q, (n, h, cfg.qk_head_dim))
    put("q", q)

    # KV: the latent and the ONE shared rope slice; the norm is on the latent only.
    ckv = _linear(xp, normed, w["wkv_a"], w.get("bkv_a"))
    c = normalize(xp, ckv[:, :r], cfg.kv_a_norm, w["kv_a_norm"], None, be.acc_dtype)
    k_pe = ckv[:, r:]
    put("kv_latent", c)

    q_nope, q_pe = q[..., :nope], q[..., nope:]
    p0 = kvmod.query_start(kv)
    pos = np.arange(p0, p0 + n, dtype=np.int64)
    if cfg.rope is not None:
        q_pe, k_pe = _rotate_pe(be, cfg.rope, cfg.yarn, q_pe, k_pe, pos)
    if cfg.temperature is not None:
        # mistral4: HF Mistral4Attention.forward scales the whole query after RoPE
        # (get_llama_4_attn_scale), and its q_pe / q_rope taps read that query; llama.cpp
        # deepseek2.cpp scales the absorbed Qcur ([q_nope k_b | q_pe], linear in both) into
        # Qcur_attn_temp_scaled when the file names a temperature scale
        q_nope, q_pe = temper(be, cfg.temperature, pos, q_nope), temper(be, cfg.temperature, pos, q_pe)
    if rope_d:
        put("q_pe", q_pe)
        put("k_pe", k_pe)
    put("q_rope", xp.concat([q_nope, q_pe], axis=-1))

    heads, probs, k_pos = _mla_kv_b(layer, q_nope, q_pe, c, k_pe, kv, pos, put)
    if trace is not None:
        trace.put_probs(probs, pos, k_pos)
    put("attn_heads", heads)

    branch = xp.reshape(heads, (n, h * cfg.v_head_dim))
    if cfg.use_output_gate:
        # spec mla_forward_token `gated`: attn_out * sigmoid(g_proj(hidden)), where
        # `hidden` is what Q and KV were projected from -- the normed input (llama.cpp
        # kimi-k3.cpp: "the output gate reads the *normed* layer input").
        branch = branch * _sigmoid(xp, _linear(xp, normed, w["wg"], None))
    put("attn_branch", branch)

    out = _linear(xp, branch, w["wo"], w.get("bo"))
    put("attn_out", out)
    if cfg.residual == "parallel":
        return out, None
    # MiniCPM3's muP residual scale (MlaConfig.residual_multiplier)
    resid = x + out * cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else x + out
    put("resid_mid", resid)
    return out, resid


def _rotate_pe(be: Backend, rope: RopeSpec, yarn: MlaYarn | None, q_pe, k_pe, pos: np.ndarray):
    """Spec ``rotate_pe``: the interleaved rotation at ``rope``'s bands -- divided
    by YaRN's per-band factors when the file declares YaRN -- then YaRN's
    magnitude on the rotated channels (all of the slice, since the rotated width
    is ``qk_rope``). ``k_pe[n, rope]`` is ONE vector per position shared by every
    head (``kv_a_proj_with_mqa``): it is rotated once, at its own position,
    before anything broadcasts it."""
    xp = be.xp
    if yarn is not None:
        rope = replace(rope, inv_freq=tuple(f / y for f, y in zip(rope.inv_freq, yarn.freq_factors)))
    cos, sin = ropemod.cos_sin_on(be, rope, pos)  # the device table, built once in float64 and sliced
    d = rope.rotary_dim
    q_pe = ropemod.rotate(xp, q_pe, cos, sin, rope.layout, d)
    k_pe = ropemod.rotate(xp, k_pe[:, None, :], cos, sin, rope.layout, d)[:, 0, :]
    mag = 1.0 if yarn is None else yarn.pe_magnitude
    if mag != 1.0:
        q_pe, k_pe = q_pe * mag, k_pe * mag
    return q_pe, k_pe


def _mla_kv_b(layer: MlaLayer, q_nope, q_pe, c, k_pe, kv, pos: np.ndarray, put):
    """The decompression, the cache push and the attention of one form (the
    spec's ``MlaKvB``: ``Combined`` -> naive, ``Split`` -> absorbed). Returns
    ``(heads[n, H, v], probs[H, n, L], key_positions)``."""
    cfg, be, w = layer.cfg, layer.backend, layer.w
    xp = be.xp
    n, h, nope, r = q_nope.shape[0], cfg.n_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
    if cfg.form == "naive":
        # spec naive_attention / deepseek2.cpp's !is_mla arm: kv_b expands this row's
        # latent into per-head k_nope and v; K = [k_nope | k_pe] with the shared k_pe
        # copied into every head.
        kvb = xp.reshape(_linear(xp, c, w["wkv_b"], None), (n, h, nope + cfg.v_head_dim))
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        k = xp.concat([k_nope, xp.broadcast_to(k_pe[:, None, :], (n, h, k_pe.shape[-1]))], axis=-1)
        put("k_rope", k)
        q = xp.concat([q_nope, q_pe], axis=-1)
        k_all, v_all, k_pos = kvmod.push_and_read(kv, k, v)
        heads, probs = attend(be, q, k_all, v_all, pos, k_pos, scale=kq_scale(cfg), head_map=np.arange(h))
        return heads, probs, k_pos
    # spec absorbed_attention / deepseek2.cpp's is_mla arm: absorb q_nope through
    # k_b[h] ([kv_lora_rank, nope], the absorb direction), attend as MQA over the
    # latent rows [c | k_pe], read V as the latent part of the same rows, pull the
    # weighted latent back through v_b[h].
    q_abs = xp.permute_dims(xp.matmul(xp.permute_dims(q_nope, (1, 0, 2)), xp.matrix_transpose(w["wk_b"])), (1, 0, 2))
    q = xp.concat([q_abs, q_pe], axis=-1)  # [n, H, kv_lora_rank + rope]
    put("q_absorbed", q)
    latent = xp.concat([c, k_pe], axis=-1)  # [n, kv_lora_rank + rope]: the cache row
    l_all, _, k_pos = kvmod.push_and_read(kv, latent, None)
    keys = l_all[:, None, :]  # one KV head
    values = l_all[:, None, :r]  # V = the first kv_lora_rank channels of the row
    # MQA over the latent: every query head reads the one latent KV head
    lat, probs = attend(be, q, keys, values, pos, k_pos, scale=kq_scale(cfg), head_map=np.zeros(h, dtype=np.int64))
    heads = xp.permute_dims(xp.matmul(xp.permute_dims(lat, (1, 0, 2)), xp.matrix_transpose(w["wv_b"])), (1, 0, 2))
    return heads, probs, k_pos
