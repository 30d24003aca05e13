"""The attention half of one decoder layer, written once.

One body (``attn_block``) for every caller: prefill (many rows in one call) and
decode (one row), every KV backing (a named variant, ``impl.kv``), NumPy and
torch (one array namespace, ``impl.backend``), every dtype. The decorations
follow the order of the spec's ``attn_block_tail`` / ``attn_branch_rows`` /
``project_attn_rows`` (``spec/attn_block.rs.txt``):

  input norm -> QKV projection (weights only) -> interleaved Q gate split ->
  QKV bias (Q at the Q width, after the split) -> QKV clamp -> QK norm
  (pre-RoPE; per head, per head with a weight each, or whole row; with a bias
  for a LayerNorm) -> the clamp after it (olmoe) -> V norm (gemma3n) -> RoPE
  (with its per-pair divisors -- LongRoPE -- and attention factor) -> QK norm
  (post-RoPE) -> temperature (offset 1: llama4, 0: ministral3) -> push + attend
  (window, softcap -- none on the sink arm --, ALiBi, sinks) -> window eviction
  (a KV option, off by default) -> interleaved gate -> output gate (sigmoid or
  softplus, per channel or one scalar per head) -> sub-norm -> wo -> wo scale ->
  wo bias -> value scale -> post-attention norm -> residual.

A layer with no attention (``shape="absent"``) returns no branch; a layer whose
attention is one linear map (``shape="linear"``, deci's) returns ``wo(normed)``
and nothing else (spec ``AttnShape::Linear => o_proj.apply(normed)``: no bias).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kv as kvmod
from . import rope as ropemod
from .backend import Backend
from .config import ConfigError, LayerConfig, alibi_slopes, lowest_visible, softmax_scale
from .norms import normalize
from .ops import device_kw as _dev
from .ops import linear as _linear
from .ops import noop as _noop
from .ops import sigmoid as _sigmoid
from .ops import softplus as _softplus
from .recurrent import RecurrentLayer, recurrent_branch

# The weights a layer may carry, in HF nn.Linear layout ([out, in]). Presence
# turns on the decorations the spec says "the tensor decides".
LAYER_WEIGHTS = {
    "attn_norm": "input norm weight [hidden]",
    "attn_norm_b": "input norm bias [hidden] (LayerNorm families)",
    "wq": "[n_heads * head_dim (x2 with an interleaved gate), hidden]",
    "wk": "[n_kv_heads * head_dim, hidden]",
    "wv": "[n_kv_heads * v_head_dim, hidden]",
    "bq": "[n_heads * head_dim] q bias, at the Q width: added after the interleaved gate is split off",
    "bk": "[n_kv_heads * head_dim] k bias",
    "bv": "[n_kv_heads * v_head_dim] v bias",
    "bq_gate": "[n_heads * head_dim] the interleaved gate's own bias (HF q_proj's bias, gate halves; "
               "the spec's gate has none)",
    "q_norm": "[head_dim] (per head), [n_heads, head_dim] (a weight per head) or [n_heads * head_dim] (whole row)",
    "k_norm": "[head_dim], [n_kv_heads, head_dim] or [n_kv_heads * head_dim]",
    "q_norm_b": "a LayerNorm QK norm's bias, shaped as q_norm (HF phi q_layernorm)",
    "k_norm_b": "a LayerNorm QK norm's bias, shaped as k_norm",
    "sinks": "[n_heads] learned sink logits (gpt-oss s_aux)",
    "wg": "[n_heads * v_head_dim, hidden] separate output-gate projection ([n_heads, hidden]: one scalar per head)",
    "bg": "output-gate bias",
    "sub_norm": "[n_heads * v_head_dim] RMS weight over the concatenated heads (bitnet)",
    "wo": "[hidden, n_heads * v_head_dim]",
    "bo": "[hidden] o_proj bias",
    "post_norm": "[hidden] post-attention norm weight",
    "post_norm_b": "[hidden] post-attention norm bias",
    # ssm.<name>: a parallel SSM branch's weights (LayerConfig.parallel_ssm), by the recurrent
    # body's names (impl.recurrent.RECURRENT_WEIGHTS) without its input norm: it reads the
    # attention's normed row
}
SSM_PREFIX = "ssm."


@dataclass
class Layer:
    """A layer's config and its weights, resident on one backend."""

    cfg: LayerConfig
    backend: Backend
    w: dict = field(default_factory=dict)
    slopes: object = None
    ssm: object = None  # the parallel SSM branch, an impl.recurrent.RecurrentLayer (None: none)

    @classmethod
    def load(cls, cfg: LayerConfig, weights: dict, backend: Backend) -> "Layer":
        ssm_w = {k[len(SSM_PREFIX):]: v for k, v in weights.items() if k.startswith(SSM_PREFIX)}
        weights = {k: v for k, v in weights.items() if not k.startswith(SSM_PREFIX)}
        unknown = set(weights) - set(LAYER_WEIGHTS)
        if unknown:
            raise ConfigError(f"unknown layer weights {sorted(unknown)}; valid: {', '.join(LAYER_WEIGHTS)}")
        if ssm_w and cfg.parallel_ssm is None:
            raise ConfigError(f"weights {sorted(SSM_PREFIX + k for k in ssm_w)} are a parallel SSM branch's; valid: "
                              f"with LayerConfig.parallel_ssm set")
        if "attn_norm" in ssm_w or "attn_norm_b" in ssm_w:
            raise ConfigError("a parallel SSM branch reads the attention's normed row; valid: no ssm.attn_norm")
        _check_shapes(cfg, weights)
        ssm = None
        if cfg.parallel_ssm is not None:
            ssm = RecurrentLayer.load(cfg.parallel_ssm, ssm_w, backend)
        w = {k: backend.asarray(v) for k, v in weights.items() if v is not None}
        slopes = None
        if cfg.alibi_max_bias is not None:
            slopes = backend.asarray(np.asarray(alibi_slopes(cfg.n_heads, cfg.alibi_max_bias)), backend.acc_dtype)
        return cls(cfg, backend, w, slopes, ssm)

    # the layer protocol the runner drives (impl.runner): a body and its cache rows
    def block(self, x, kv, trace=None):
        return attn_block(self, x, kv, trace)

    def has_kv(self) -> bool:
        """Whether the layer keeps K/V rows of its own (a kv_source layer reads its source's)."""
        return self.cfg.shape == "gqa" and self.cfg.kv_source is None

    def kv_row_shapes(self) -> tuple[tuple, tuple | None]:
        """One position's K and V as the cache holds them."""
        return (self.cfg.n_kv_heads, self.cfg.head_dim), (self.cfg.n_kv_heads, self.cfg.dv)


def _expected_shapes(cfg: LayerConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """``(required, optional)``: every weight the layer may carry, with its shape.
    A weight outside both is one the config switched off (it would be ignored)."""
    hid = cfg.hidden_size
    norm = {"attn_norm": (hid,), "attn_norm_b": (hid,)}
    if cfg.shape == "linear":  # spec AttnShape::Linear: o_proj(normed), nothing else
        return {"wo": (hid, hid)}, norm
    h, hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    required = {"wq": (h * d * (2 if cfg.q_gate_interleaved else 1), hid), "wk": (hkv * d, hid),
                "wv": (hkv * dv, hid), "wo": (hid, h * dv)}
    optional = {**norm, "bq": (h * d,), "bk": (hkv * d,), "bv": (hkv * dv,), "sinks": (h,), "bo": (hid,)}
    shared = cfg.kv_source is not None  # K / V are the source layer's: no wk, wv, bk, bv, k_norm here
    if cfg.q_gate_interleaved:
        optional["bq_gate"] = (h * d,)
    if cfg.output_gate:
        g = h if cfg.output_gate_per_head else h * dv
        required["wg"] = (g, hid)
        optional["bg"] = (g,)
    if cfg.qk_norm is not None:
        row = cfg.qk_norm.over == "row"
        qs, ks = ((h * d,), (hkv * d,)) if row else ((h, d), (hkv, d)) if cfg.qk_norm.per_head else ((d,), (d,))
        optional.update(q_norm=qs, k_norm=ks)
        if cfg.qk_norm.norm.kind == "layer":
            optional.update(q_norm_b=qs, k_norm_b=ks)
    if shared:
        for name in ("wk", "wv"):
            required.pop(name)
        for name in ("bk", "bv", "k_norm", "k_norm_b"):
            optional.pop(name, None)
    if cfg.sub_norm:  # a NormSpec, or None
        optional["sub_norm"] = (h * dv,)
    if cfg.post_norm:
        optional.update(post_norm=(hid,), post_norm_b=(hid,))
    return required, optional


def _check_shapes(cfg: LayerConfig, w: dict) -> None:
    """Every weight's shape against the config, before any arithmetic (one line
    naming the weight, its shape and the expected one)."""
    if cfg.shape == "absent":
        extra = sorted(k for k, v in w.items() if v is not None)
        if extra:
            raise ConfigError(f"a layer with no attention takes no weights; got {extra}")
        return
    required, optional = _expected_shapes(cfg)
    for name, shape in required.items():
        if w.get(name) is None:
            raise ConfigError(f"layer weights lack {name!r} {shape}")
    for name, v in w.items():
        if v is None:
            continue
        shape = required.get(name, optional.get(name))
        if shape is None:
            raise ConfigError(f"weight {name!r} does not apply to this layer (its decoration is off in the config: "
                              f"shape {cfg.shape}, q_gate_interleaved={cfg.q_gate_interleaved}, "
                              f"output_gate={cfg.output_gate}, qk_norm={cfg.qk_norm is not None}, "
                              f"sub_norm={cfg.sub_norm is not None}, post_norm={cfg.post_norm is not None}, "
                              f"kv_source={cfg.kv_source}); "
                              f"valid here: {', '.join(sorted({**required, **optional}))}")
        got = tuple(np.shape(v))
        if got != shape:
            raise ConfigError(f"weight {name} has shape {got}, expected {shape}")


def attn_block(layer: Layer, x, kv: kvmod.KvStep | None, trace=None):
    """Run ``x[n, hidden]`` (the layer's input rows, one sequence) through the
    attention half of the layer.

    Returns ``(branch, resid_mid)``: the branch added to the residual (``None``
    for an absent layer) and the residual after it (``None`` for a parallel
    block, whose residual also takes the FFN's branch).
    """
    cfg, be = layer.cfg, layer.backend
    xp, w = be.xp, layer.w
    put = trace.put if trace is not None else _noop

    put("layer_in", x)
    if cfg.shape == "absent":
        # deci.cpp: no attention branch; the residual passes straight through.
        put("resid_mid", x)
        return None, x
    normed = normalize(xp, x, cfg.input_norm, w.get("attn_norm"), w.get("attn_norm_b"), be.acc_dtype)
    put("attn_in", normed)
    if cfg.shape == "linear":
        # deci.cpp: `attn_norm` then `wo`, nothing else (spec AttnShape::Linear:
        # `o_proj.apply(normed)`, no bias -- _check_shapes refuses one).
        branch = _linear(xp, normed, w["wo"], None)
        put("attn_out", branch)
        return _residual(layer, x, branch, put, normed)

    n = x.shape[0]
    h, hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
    # HF FalconH1DecoderLayer.forward `self_attn(hidden_states * attention_in_multiplier)`
    a_in = normed * cfg.attn_in_multiplier if cfg.attn_in_multiplier != 1.0 else normed
    # spec project_qkv: the three products, weights only
    q = _linear(xp, a_in, w["wq"], None)
    # a layer reading another layer's K/V (kv_source; HF Gemma3nTextAttention.is_kv_shared_layer,
    # gemma3n.cpp `!hparams.has_kv(il)`) projects Q alone: its K / V are the source's cached rows
    shared = cfg.kv_source is not None
    k = None if shared else _linear(xp, a_in, w["wk"], None)
    v = None if shared else _linear(xp, a_in, w["wv"], None)
    gate = None
    if cfg.q_gate_interleaved:
        # qwen3next / qwen35 (HF `torch.chunk(q_proj(x).view(..., head_dim * 2), 2, -1)`,
        # llama.cpp qwen35.cpp): the gate rides in wq, interleaved PER HEAD; split it
        # off before anything reads a Q width (spec split_interleaved_q_gate).
        qg = xp.reshape(q, (n, h, 2 * d))
        q, gate = qg[..., :d], xp.reshape(qg[..., d:], (n, h * d))
        q = xp.reshape(q, (n, h * d))
        if "bq_gate" in w:
            # HF's q_proj bias is as wide as q_proj: its gate halves bias the gate
            gate = gate + w["bq_gate"]
    # spec apply_qkv_bias_and_clamp, AFTER the split: Q's bias at the Q width
    if "bq" in w:
        q = q + w["bq"]
    if "bk" in w:  # (a shared layer carries no bk / bv: _check_shapes)
        k = k + w["bk"]
    if "bv" in w:
        v = v + w["bv"]
    if cfg.key_multiplier != 1.0 and not shared:
        # HF FalconH1Attention.forward `k_proj(hidden_states).view(...) * self.key_multiplier`, before RoPE
        k = k * cfg.key_multiplier
    if cfg.qkv_clamp is not None and cfg.qkv_clamp_at == "bias":
        # olmo `clip_qkv`; llama.cpp build_qkv `f_clamp_kqv`: after the bias.
        c = cfg.qkv_clamp
        if shared:  # Q alone: a kv_source layer's K / V are the source's, clamped there
            q = xp.clip(q, -c, c)
        else:
            q, k, v = (xp.clip(t, -c, c) for t in (q, k, v))
    q = xp.reshape(q, (n, h, d))
    put("q", q)
    if not shared:
        k = xp.reshape(k, (n, hkv, d))
        v = xp.reshape(v, (n, hkv, dv))
        put("k", k)
        put("v", v)

    if cfg.qk_norm is not None and cfg.qk_norm.where == "pre_rope":
        q, k = _qk_norm(layer, q, k)
    if cfg.qkv_clamp_at == "qk_norm":
        # HF OlmoeAttention.forward: q_norm / k_norm first, THEN clamp_(-clip_qkv, clip_qkv)
        # on q, k and v (v has no norm: the same values as a clamp after its bias)
        if shared:
            q = xp.clip(q, -cfg.qkv_clamp, cfg.qkv_clamp)
        else:
            q, k, v = (xp.clip(t, -cfg.qkv_clamp, cfg.qkv_clamp) for t in (q, k, v))
    if cfg.v_norm is not None and not shared:
        # HF Gemma3nTextAttention.forward: v_norm (RMS, no weight) per head before the
        # cache; gemma3n.cpp: ggml_rms_norm(Vcur, norm_rms_eps)
        v = normalize(xp, v, cfg.v_norm, None, None, be.acc_dtype)
    p0 = kvmod.query_start(kv)
    pos = np.arange(p0, p0 + n, dtype=np.int64)
    rope = cfg.rope  # None: a NoPE layer (smollm3's every 4th, cohere2's full layers)
    if rope is not None:
        cos, sin = ropemod.cos_sin_on(be, rope, pos)  # the layer's device table, uploaded once
        q = ropemod.rotate(xp, q, cos, sin, rope.layout, rope.rotary_dim)
        if not shared:
            k = ropemod.rotate(xp, k, cos, sin, rope.layout, rope.rotary_dim)
    if cfg.qk_norm is not None and cfg.qk_norm.where == "post_rope":
        q, k = _qk_norm(layer, q, k)
    q = temper(be, cfg.temperature, pos, q)
    put("q_rope", q)
    if not shared:
        put("k_rope", k)

    k_all, v_all, k_pos = kvmod.push_and_read(kv, k, v)
    heads, probs = attend(be, q, k_all, v_all, pos, k_pos, scale=softmax_scale(cfg),
                          head_map=np.arange(cfg.n_heads) // cfg.n_rep, window=cfg.window,
                          softcap=cfg.softcap, sinks=w.get("sinks"), slopes=layer.slopes,
                          want_probs=trace is not None)
    if trace is not None:
        trace.put_probs(probs, pos, k_pos)
    if cfg.window is not None:
        # spec evict_layer_kv: AFTER the read, with the window the kernel just used;
        # a no-op unless the KV was made with eviction on (FRINK_KV_WINDOW)
        kvmod.evict_layer_kv(kv, int(lowest_visible(cfg.window, pos[-1] + 1)))
    put("attn_heads", heads)

    branch = xp.reshape(heads, (n, h * dv))
    # spec attn_branch_rows: the interleaved Q gate, THEN (independently) the output gate
    if gate is not None:
        # qwen35.cpp / HF Qwen3NextAttention: attn * sigmoid(gate), before wo.
        branch = branch * _sigmoid(xp, gate)
    if cfg.output_gate:
        # spec `output_gate`: a projection of the SAME normed input the QKV read.
        branch = branch * _output_gate(layer, normed, n)
    if cfg.sub_norm is not None:
        # bitnet.cpp / HF BitNetAttention `attn_sub_norm`: RMS over the concatenated
        # heads of one row, before wo.
        branch = normalize(xp, branch, cfg.sub_norm, w.get("sub_norm"), None, be.acc_dtype)
    put("attn_branch", branch)

    out = _linear(xp, branch, w["wo"], None)
    # spec project_attn_rows: the wo scale companion, THEN the bias (build_attn's
    # order), then the value scale (mimo2.cpp), then the post-attention norm.
    if cfg.o_scale is not None:
        out = out * cfg.o_scale
    if "bo" in w:
        out = out + w["bo"]
    if cfg.value_scale is not None:
        out = out * cfg.value_scale
    if cfg.post_norm is not None:
        out = normalize(xp, out, cfg.post_norm, w.get("post_norm"), w.get("post_norm_b"), be.acc_dtype)
    if cfg.attn_out_multiplier != 1.0:
        # HF FalconH1DecoderLayer.forward: the attention module's output `* attn_out_multiplier`
        out = out * cfg.attn_out_multiplier
    put("attn_out", out)
    if layer.ssm is not None:
        # spec parallel_ssm_rows / falcon-h1.cpp:156-160: the Mamba-2 block on the SAME normed row
        # (HF FalconH1DecoderLayer.forward: `self.mamba(hidden_states=hidden_states)`, its input
        # scaled by ssm_in_multiplier inside FalconH1Mixer.forward), its output * ssm_out_multiplier,
        # summed with the attention's (spec add_parallel_ssm; falcon-h1.cpp `ggml_add(attn_out, ssm_out)`)
        s_in = normed * cfg.ssm_in_multiplier if cfg.ssm_in_multiplier != 1.0 else normed
        ssm = recurrent_branch(layer.ssm, s_in, kvmod.recurrent_slot(kv))
        if cfg.ssm_out_multiplier != 1.0:
            ssm = ssm * cfg.ssm_out_multiplier
        put("ssm_out", ssm)
        out = out + ssm
    return _residual(layer, x, out, put, normed)


def temper(be: Backend, t, pos: np.ndarray, q):
    """``q[n, H, d]`` times the per-position attention temperature ``t``
    (``contract.layers.TemperatureSpec``; None: ``q`` unchanged). llama.cpp
    ``llm_graph_input_attn_temp::set_input``: ``log(floor((pos + offset) / floor_scale) + 1)
    * scale + 1`` per query position -- offset 1 for llama4 (HF
    ``Llama4TextAttention.forward``: ``floor((cache_position + 1) / floor_scale)``), 0 for
    ministral3 and mistral4 (HF ``get_llama_4_attn_scale``: ``floor(position_ids /
    original_max_position_embeddings)``). One body for attention and MLA."""
    if t is None:
        return q
    scales = np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1.0
    return q * be.asarray(scales)[:, None, None]


def attend(be: Backend, q, k, v, q_pos: np.ndarray, k_pos: np.ndarray, *, scale: float, head_map,
           window=None, softcap: float | None = None, sinks=None, slopes=None, want_probs: bool = True):
    """The one kernel: plain, windowed, softcapped, ALiBi'd and sink-bearing --
    and MLA's (``impl.mla``: per-head K/V in the naive form, one latent KV head in
    the absorbed form), so every body attends through the same arithmetic.

    ``q[n, H, D]`` against the sequence's ``k[L, Hkv, D]``, ``v[L, Hkv, Dv]``;
    query head ``h`` reads KV head ``head_map[h]`` (GQA: ``h // (H / Hkv)``, HF
    ``repeat_kv``, ggml's broadcast in ``mul_mat``). Returns
    ``(heads[n, H, Dv], probs[H, n, L])`` (``probs`` None unless ``want_probs``).

    Query rows go in blocks of about ``BLOCK`` score elements, each against the
    span of keys some row of the block can see: every row's softmax is whole
    inside its block, and a key no row of the block sees would only add exact
    zeros (its probability is ``exp(-inf) = 0``). So the explicit softmax's
    ``[H, rows, keys]`` temporaries stay in cache, a causal prefill skips the
    masked half, a windowed layer the keys behind its window, and a long prefill
    never holds several ``[H, n, L]`` arrays at once (a 512-token prefill of 32
    heads ran 1.5x HF's fused softmax unblocked; scripts/bench_real_size.py).
    """
    xp = be.xp
    head_map = be.index(head_map)
    # gathered head-major (the gather's result is laid out [H, D, L] / [H, L, Dv], so
    # each block's product reads it as it is, not through a strided view)
    kh = xp.take(xp.permute_dims(k, (1, 2, 0)), head_map, axis=0)  # [H, D, L]
    vh = xp.take(xp.permute_dims(v, (1, 0, 2)), head_map, axis=0)  # [H, L, Dv]

    # Causal, and inside the layer's window as a function of the query position
    # (spec `layer_window_for_query`); the same rule decides what may be evicted.
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] >= lowest_visible(window, q_pos)[:, None]

    n, n_heads, n_keys = q.shape[0], q.shape[1], kh.shape[-1]
    rows = max(1, BLOCK // max(1, n_heads * n_keys))
    heads, probs = [], []
    for a in range(0, n, rows):
        vis = visible[a:a + rows]
        seen = np.flatnonzero(vis.any(axis=0))
        lo, hi = (int(seen[0]), int(seen[-1]) + 1) if seen.size else (0, n_keys)
        h, p = _attend_rows(be, q[a:a + rows], kh[:, :, lo:hi], vh[:, lo:hi], q_pos[a:a + rows], k_pos[lo:hi],
                            vis[:, lo:hi], scale, softcap, sinks, slopes)
        heads.append(h)
        if want_probs:
            if (lo, hi) != (0, n_keys):  # the keys the block does not see: probability exactly 0
                z = (n_heads, p.shape[1])
                p = xp.concat([xp.zeros((*z, lo), dtype=p.dtype, **_dev(be)), p,
                               xp.zeros((*z, n_keys - hi), dtype=p.dtype, **_dev(be))], axis=-1)
            probs.append(p)
    one = len(heads) == 1
    return (heads[0] if one else xp.concat(heads, axis=0),
            None if not want_probs else probs[0] if one else xp.concat(probs, axis=1))


BLOCK = 1 << 19  # score elements per block of query rows (attend): 2 MB of float32


def _attend_rows(be: Backend, q, kh, vh, q_pos: np.ndarray, k_pos: np.ndarray, visible: np.ndarray, scale,
                 softcap, sinks, slopes):
    """``attend`` for a block of query rows ``q[rows, H, D]`` against the gathered
    keys ``kh[H, D, L]`` and values ``vh[H, L, Dv]``, ``visible[rows, L]``."""
    xp = be.xp
    acc = be.acc_dtype
    qh = xp.permute_dims(q, (1, 0, 2))  # [H, n, D]
    # copy=False: no pass over the [H, n, L] scores where the type is already right
    scores = xp.astype(xp.matmul(qh, kh), acc, copy=False) * scale

    # "The sink arm carries no softcap, matching llama.cpp's" (spec push_and_attend_row).
    if softcap is not None and sinks is None:
        scores = softcap * xp.tanh(scores / softcap)
    if slopes is not None:
        # ALiBi: slope_h * (k_pos - q_pos); a per-row constant shift of HF bloom's
        # slope_h * k_pos, so the softmax is the same.
        rel = be.asarray((k_pos[None, :] - q_pos[:, None]).astype(np.float64), acc)
        scores = scores + slopes[:, None, None] * rel[None, :, :]

    neg_inf = xp.asarray(-np.inf, dtype=acc, **_dev(be))
    scores = xp.where(be.mask(visible)[None, :, :], scores, neg_inf)

    m = xp.max(scores, axis=-1, keepdims=True)
    if sinks is not None:
        # gpt-oss: the sink joins the softmax denominator and contributes no value
        # (HF eager_attention_forward's extra column, dropped after the softmax).
        s = xp.reshape(xp.astype(sinks, acc), (q.shape[1], 1, 1))
        m = xp.maximum(m, s)
        e = xp.exp(scores - m)
        probs = e / (xp.sum(e, axis=-1, keepdims=True) + xp.exp(s - m))
    else:
        e = xp.exp(scores - m)
        probs = e / xp.sum(e, axis=-1, keepdims=True)
    out = xp.matmul(xp.astype(probs, vh.dtype, copy=False), vh)  # [H, n, Dv]
    return xp.permute_dims(out, (1, 0, 2)), probs


def _output_gate(layer: Layer, normed, n: int):
    """The output gate's factor on the ``[n, n_heads * v_head_dim]`` branch: sigmoid
    (afmoe.cpp ``attn_gated``) or softplus (HF ``LagunaAttention.forward``:
    ``F.softplus(g_proj(x).float())``; laguna.cpp) of ``wg`` on the normed input --
    one value per channel, or ONE scalar per head spread over its ``v_head_dim``
    channels (HF laguna ``gate_per_head``: ``gate.unsqueeze(-1)``)."""
    cfg, be, w = layer.cfg, layer.backend, layer.w
    xp = be.xp
    g = _linear(xp, normed, w["wg"], w.get("bg"))
    if cfg.output_gate_fn == "softplus":
        g = _softplus(xp, g, be.acc_dtype)
    else:
        g = _sigmoid(xp, g)
    if cfg.output_gate_per_head:
        h, dv = cfg.n_heads, cfg.dv
        g = xp.reshape(xp.broadcast_to(xp.reshape(g, (n, h, 1)), (n, h, dv)), (n, h * dv))
    return g


def _qk_norm(layer: Layer, q, k):
    cfg, be, w = layer.cfg, layer.backend, layer.w
    xp = be.xp
    spec = cfg.qk_norm
    if spec.over == "head":
        # [head_dim] weights broadcast over the heads; per_head's [heads, head_dim] ones
        # meet each head's own row (HF StableLmLayerNormPerHead, CohereLayerNorm)
        return (
            normalize(xp, q, spec.norm, w.get("q_norm"), w.get("q_norm_b"), be.acc_dtype),
            # k None: a layer reading another layer's K/V (kv_source) norms Q alone
            None if k is None else normalize(xp, k, spec.norm, w.get("k_norm"), w.get("k_norm_b"), be.acc_dtype),
        )
    # Whole row (olmo2 HF `q_norm` over num_heads * head_dim).
    n = q.shape[0]
    qr = normalize(xp, xp.reshape(q, (n, -1)), spec.norm, w.get("q_norm"), w.get("q_norm_b"), be.acc_dtype)
    if k is None:
        return xp.reshape(qr, q.shape), None
    kr = normalize(xp, xp.reshape(k, (n, -1)), spec.norm, w.get("k_norm"), w.get("k_norm_b"), be.acc_dtype)
    return xp.reshape(qr, q.shape), xp.reshape(kr, k.shape)


def _residual(layer: Layer, x, branch, put, normed=None):
    cfg = layer.cfg
    if cfg.residual == "parallel":
        # cohere2: attention and FFN read the same normed input and are summed into
        # the residual together; there is no residual between them to report.
        return branch, None
    if cfg.residual_base == "normed":
        # HF MiniMaxDecoderLayer.forward: `residual = input_layernorm(x)`, then
        # `residual * attn_alpha_factor + attn * attn_beta_factor` (beta: residual_multiplier);
        # minimax-01.cpp `ggml_scale(residual, f_residual_scale)` on the attn_norm output
        x = normed * cfg.residual_alpha if cfg.residual_alpha != 1.0 else normed
    elif cfg.residual_alpha != 1.0:
        x = x * cfg.residual_alpha
    resid = x + branch * cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else x + branch
    put("resid_mid", resid)
    return branch, resid


