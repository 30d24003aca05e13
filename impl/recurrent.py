"""The recurrent layers hybrid models put in attention's place, written once.

One body (``recurrent_block``) for every recurrent kind -- gated delta-net,
Kimi delta attention, short conv, Mamba-2, Mamba-1, lightning attention --
whose differences are a description (``contract.recurrent.RecurrentConfig``),
and for every caller: prefill and decode, every KV backing (the state lives in
the sequence's slot, ``impl.kv.recurrent_slot``), NumPy and torch, every dtype.
In dataflow order:

  input norm -> projections (per role) -> causal conv over (conv state ++ rows)
  + activation -> q / k / v, beta and the log-decay g -> q/k L2 norm, q scale
  -> the recurrence ``S = exp(g) * S + k (x) u; y = S^T q`` (delta rule or plain
  write; ``scan``: one row after another, or in chunks) in the backend's
  accumulation dtype (float32 for 16-bit dtypes, as HF's ``.float()`` scans and
  ggml's F32 states) -> D skip -> output stage (gated RMS norm / gate) ->
  out_proj -> residual.

Where the references round: projections and the conv output in the compute
dtype (HF ``causal_conv1d_fn`` returns the input dtype); gates, norms and the
recurrence in the accumulation dtype; ``y`` back to the compute dtype before the
output stage (HF ``core_attn_out.to(initial_dtype)``), the output stage in the
accumulation dtype, out_proj in the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kv as kvmod
from .backend import Backend
from .config import ConfigError
from .norms import normalize
from .ops import device_kw as _dev
from .ops import linear as _linear
from .ops import noop as _noop
from .ops import sigmoid as _sigmoid
from .recurrent_kinds import RecurrentConfig, head_index, query_scale
from . import recurrent_scan  # looked up at each call, as a test's patch of the module expects
from .recurrent_scan import chunk_steps, scan_chunked, scan_sequential

# The weights a recurrent layer may carry, per role, in HF nn.Linear layout ([out, in]).
# C = conv channels (RecurrentConfig.conv_channels), W = the output row (RecurrentConfig.width).
RECURRENT_WEIGHTS = {
    "attn_norm": "[hidden] input norm weight",
    "attn_norm_b": "[hidden] input norm bias (LayerNorm families)",
    "w_in": "[C, hidden] the rows that enter the causal conv, by role: gated_delta_net q|k|v (Hk*Dk, Hk*Dk, "
            "Hv*Dv; HF in_proj_qkv, or qwen3_next's in_proj_qkvz un-interleaved), kimi_delta q|k|v (q/k/v_proj), "
            "mamba2 x|B|C (Hv*Dv, G*N, G*N: in_proj's middle rows), mamba1 x (in_proj's first half), short_conv x "
            "(in_proj's last third); lightning q|k|v (H*D each, qkv_proj un-interleaved per head; no conv)",
    "b_in": "[C] its bias (in_bias)",
    "w_bx": "[hidden, hidden] short_conv's B, multiplying x before the conv (lfm2 in_proj's first third)",
    "b_bx": "[hidden] its bias (in_bias)",
    "w_z": "[W, hidden] the output gate's input z (gated_delta_net z, mamba z, lightning output_gate, short_conv C "
           "= in_proj's middle third); kimi_delta [W, z_rank] (g_b_proj, after w_z_a)",
    "w_z_a": "[z_rank, hidden] kimi_delta g_a_proj",
    "b_z": "[W] its bias (in_bias)",
    "w_beta": "[Hv, hidden] beta's projection (gated_delta_net b, kimi_delta b_proj)",
    "w_decay": "[Hv, hidden] gated_delta_net a, mamba2 in_proj's dt rows; kimi_delta [Hv * Dk, decay_rank] (f_b_proj)",
    "w_decay_a": "[decay_rank, hidden] kimi_delta f_a_proj",
    "b_decay": "[Hv] mamba2 in_proj's dt-row bias (in_bias)",
    "dt_bias": "[Hv] gated_delta_net / mamba2 dt_bias; [Hv * Dk] kimi_delta dt_bias; [d_inner] mamba1 dt_proj.bias",
    "A_log": "[Hv] gated_delta_net / kimi_delta / mamba2; [d_inner, N] mamba1 (A = -exp(A_log))",
    "D": "[Hv] mamba2, [d_inner] mamba1: the skip y += D * x",
    "w_x_proj": "[dt_rank + 2N, d_inner] mamba1 x_proj (dt | B | C rows)",
    "w_dt": "[d_inner, dt_rank] mamba1 dt_proj.weight",
    "dt_norm": "[dt_rank] mamba1 jamba's dt RMS weight (bc_norm; absent: falcon_mamba's weightless norm)",
    "b_norm": "[N] mamba1 jamba's B RMS weight",
    "c_norm": "[N] mamba1 jamba's C RMS weight",
    "conv": "[C, K] the depthwise causal conv (HF conv1d.weight squeezed): column K-1 multiplies the current row",
    "conv_b": "[C] its bias (conv_bias)",
    "out_norm": "[Dv] per-head output RMS weight (gated_delta_net, kimi_delta); [W] mamba2 (grouped) / lightning (row)",
    "wo": "[hidden, W] out_proj",
    "bo": "[hidden] out_proj bias (out_bias)",
}

# Canonical probes of a recurrent layer, in dataflow order (name -> "[shape] meaning");
# a kind records the ones it has. T = the call's rows.
RECURRENT_PROBES = {
    "layer_in": "[T, hidden] the layer's input",
    "attn_in": "[T, hidden] the normed input",
    "rec_conv_in": "[T, C] what enters the causal conv (short_conv: B * x; none for lightning)",
    "rec_conv": "[T, C] the conv output after its activation (lightning: none)",
    "rec_z": "[T, Hv, Dv] the output gate's input z, before its activation (short_conv: C [T, hidden]; "
             "mamba1: [T, d_inner])",
    "rec_q": "[T, Hk, Dk] q as it enters the recurrence: after the L2 norm, before the q scale the recurrence's "
             "read applies (mamba: C [T, G, N]; mamba1 [T, N])",
    "rec_k": "[T, Hk, Dk] k as it enters the recurrence: after the L2 norm (mamba: B [T, G, N]; mamba1 [T, N])",
    "rec_v": "[T, Hv, Dv] v as it enters the recurrence (mamba: x, BEFORE the dt scale the write applies; "
             "mamba1 [T, d_inner])",
    "rec_beta": "[T, Hv] beta after its sigmoid (delta-rule kinds)",
    "rec_decay": "[T, Hv] the log-decay g applied per head (gated_delta_net, lightning: -slope), [T, Hv, Dk] per "
                 "key channel (kimi_delta); mamba: dt after softplus (and dt_limit), [T, H] / mamba1 [T, d_inner] "
                 "-- the decay applied is exp(dt * A)",
    "rec_out": "[T, Hv, Dv] the recurrence output y, after the D skip (mamba), before the output stage "
               "(mamba1: [T, d_inner])",
    "attn_branch": "[T, W] what enters out_proj (after the output norm / gate)",
    "attn_out": "[T, hidden] out_proj's output",
    "resid_mid": "[T, hidden] the residual after the branch",
}

# The state after each call (Trace.put_state; Trace.assemble stacks them along a calls axis),
# in HF's cache layout: conv as HF conv_states[..., 1:] (HF keeps K columns, the oldest
# never read) and llama.cpp's r_l rows; the recurrent matrix as HF recurrent_states.
RECURRENT_STATES = {
    "state_conv": "[calls, C, K-1] the conv rows after each call, oldest column first (none for lightning)",
    "state_rec": "[calls, ...] the recurrent matrix after each call: gated_delta_net / kimi_delta [H, Dk, Dv], "
                 "mamba2 [H, head_dim, N], mamba1 [d_inner, N], lightning [H, D, D] (none for short_conv)",
}


@dataclass
class RecurrentLayer:
    """A recurrent layer's config and its weights, resident on one backend."""
    cfg: RecurrentConfig
    backend: Backend
    w: dict = field(default_factory=dict)
    head_index: object = None
    xbc_multipliers: object = None  # proj_multipliers' x | B | C segments as one [C] row (mamba2)
    # lightning: the per-head log-decay -slope_h, float64 on the HOST -- the one array the rows'
    # decay (_recurrence_inputs) and the state's carried multipliers (recurrent_scan.carried_decays,
    # computed on the host so nothing is pulled from the device) both read
    log_decay: object = None

    @classmethod
    def load(cls, cfg: RecurrentConfig, weights: dict, backend: Backend) -> "RecurrentLayer":
        unknown = set(weights) - set(RECURRENT_WEIGHTS)
        if unknown:
            raise ConfigError(f"unknown recurrent weights {sorted(unknown)}; valid: {', '.join(RECURRENT_WEIGHTS)}")
        _check_shapes(cfg, weights)
        w = {k: backend.asarray(v) for k, v in weights.items() if v is not None}
        idx = backend.index(head_index(cfg)) if cfg.has_recurrence else None
        xbc = None
        if cfg.proj_multipliers is not None:
            _, mx, mb, mc, _ = cfg.proj_multipliers
            gn = cfg.n_k_heads * cfg.k_dim
            xbc = backend.asarray(np.concatenate([np.full(cfg.width, mx), np.full(gn, mb), np.full(gn, mc)]))
        log_decay = -np.asarray(cfg.decay_slopes, dtype=np.float64) if cfg.decay_param == "slope" else None
        return cls(cfg, backend, w, idx, xbc, log_decay)

    # the layer protocol the runner drives (impl.runner)
    def block(self, x, kv, trace=None):
        return recurrent_block(self, x, kv, trace)

    def has_kv(self) -> bool:
        """No K/V rows: the state lives in the sequence's recurrent slot, not in pages."""
        return False


def expected_shapes(cfg: RecurrentConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """``(required, optional)``: every weight the layer may carry, with its shape."""
    hid, c, wd = cfg.hidden_size, cfg.conv_channels, cfg.width
    hv, dk, dv = cfg.n_v_heads, cfg.k_dim, cfg.v_dim
    req = {"w_in": ((3 * hv * dv) if cfg.kind == "lightning" else c, hid), "w_z": (wd, hid), "wo": (hid, wd)}
    opt = {"attn_norm": (hid,), "attn_norm_b": (hid,)}
    if cfg.kind != "lightning":
        req["conv"] = (c, cfg.conv_kernel)
        if cfg.conv_bias:
            req["conv_b"] = (c,)
    if cfg.in_bias:
        req["b_in"] = (req["w_in"][0],)
        req["b_z"] = (wd,)
    if cfg.out_bias:
        req["bo"] = (hid,)
    if cfg.norm_groups:
        req["out_norm"] = (dv,) if cfg.out_norm_groups is None else (wd,)
    k = cfg.kind
    if k == "short_conv":
        req["w_bx"] = (hid, hid)
        if cfg.in_bias:
            req["b_bx"] = (hid,)
    if k in ("gated_delta_net", "kimi_delta"):
        req["w_beta"] = (hv, hid)
    if k == "gated_delta_net":
        req.update(w_decay=(hv, hid), dt_bias=(hv,), A_log=(hv,))
    if k == "kimi_delta":
        req.update(A_log=(hv,), dt_bias=(hv * dk,))
        if cfg.decay_rank is None:
            req["w_decay"] = (hv * dk, hid)
        else:
            req.update(w_decay_a=(cfg.decay_rank, hid), w_decay=(hv * dk, cfg.decay_rank))
        if cfg.z_rank is not None:
            req.update(w_z_a=(cfg.z_rank, hid), w_z=(wd, cfg.z_rank))
    if k == "mamba2":
        req.update(w_decay=(hv, hid), dt_bias=(hv,), A_log=(hv,))
        if cfg.in_bias:
            req["b_decay"] = (hv,)
    if k == "mamba1":
        req.update(w_x_proj=(cfg.dt_rank + 2 * dk, hv), w_dt=(hv, cfg.dt_rank), dt_bias=(hv,), A_log=(hv, dk))
        if cfg.bc_norm is not None:
            opt.update(dt_norm=(cfg.dt_rank,), b_norm=(dk,), c_norm=(dk,))
    if cfg.d_skip:
        req["D"] = (hv,)
    return req, opt


def _check_shapes(cfg: RecurrentConfig, w: dict) -> None:
    """Every weight's shape against the config, before any arithmetic (one line each)."""
    required, optional = expected_shapes(cfg)
    for name, shape in required.items():
        if w.get(name) is None:
            raise ConfigError(f"{cfg.kind} layer weights lack {name!r} {shape}")
    for name, v in w.items():
        if v is None:
            continue
        shape = required.get(name, optional.get(name))
        if shape is None:
            raise ConfigError(f"weight {name!r} does not apply to this {cfg.kind} layer (conv_bias={cfg.conv_bias}, "
                              f"in_bias={cfg.in_bias}, out_bias={cfg.out_bias}, d_skip={cfg.d_skip}, "
                              f"out_norm_groups={cfg.out_norm_groups}); valid here: "
                              f"{', '.join(sorted({**required, **optional}))}")
        got = tuple(np.shape(v))
        if got != shape:
            raise ConfigError(f"weight {name} has shape {got}, expected {shape}")


def recurrent_block(layer: RecurrentLayer, x, kv: kvmod.KvStep, trace=None):
    """Run ``x[n, hidden]`` (one sequence's rows for this call) through the layer,
    reading and updating the sequence's recurrent state in ``kv``'s slot.

    Returns ``(branch, resid_mid)`` as ``impl.attention.attn_block`` does.
    """
    cfg, be = layer.cfg, layer.backend
    xp, w, acc = be.xp, layer.w, be.acc_dtype
    put = trace.put if trace is not None else _noop
    slot = kvmod.recurrent_slot(kv)

    put("layer_in", x)
    normed = normalize(xp, x, cfg.input_norm, w.get("attn_norm"), w.get("attn_norm_b"), acc)
    put("attn_in", normed)
    out = recurrent_branch(layer, normed, slot, put)
    if trace is not None:
        _put_states(cfg, be, slot, trace)
    # HF MiniMaxDecoderLayer: `residual * alpha + hidden_states * beta`, residual = the NORMED input
    base = normed if cfg.residual == "normed" else x
    if cfg.residual_alpha != 1.0:
        base = base * cfg.residual_alpha
    resid = base + (out * cfg.residual_beta if cfg.residual_beta != 1.0 else out)
    put("resid_mid", resid)
    return out, resid


def recurrent_branch(layer: RecurrentLayer, normed, slot: kvmod.RecurrentState, put=_noop):
    """The recurrent block on the already-normed rows ``normed[n, hidden]``, from the
    in-projections to out_proj, advancing ``slot``: the branch before any residual.
    ONE body for a recurrent layer (``recurrent_block``) and a parallel SSM branch
    beside attention (falcon_h1: ``impl.attention.attn_block``, spec ``parallel_ssm_rows``)."""
    cfg, be = layer.cfg, layer.backend
    xp, w, acc = be.xp, layer.w, be.acc_dtype
    n = normed.shape[0]

    # the projections, per role (weights only; a kind's bias where it has one)
    conv_in = _linear(xp, normed, w["w_in"], w.get("b_in"))
    if cfg.kind == "short_conv":
        # HF Lfm2ShortConv.forward `B * x` / lfm2.cpp `ggml_mul(ctx0, b, x)`: B gates x BEFORE the conv
        conv_in = _linear(xp, normed, w["w_bx"], w.get("b_bx")) * conv_in
    z_in = normed if "w_z_a" not in w else _linear(xp, normed, w["w_z_a"], None)  # KDA g_b(g_a(x))
    z = _linear(xp, z_in, w["w_z"], w.get("b_z"))
    if cfg.proj_multipliers is not None:
        # HF FalconH1Mixer.forward `projected_states * self.mup_vector` (compute_mup_vector: z | x | B | C
        # | dt segments of in_proj's output); conversion/falcon_h1.py folds the same into ssm_in's rows
        z = z * cfg.proj_multipliers[0]
        conv_in = conv_in * layer.xbc_multipliers

    # the causal conv over (conv state ++ rows), then its activation
    if cfg.kind == "lightning":
        # HF MiniMaxLightningAttention.forward `act_fn(qkv_proj(x))`; minimax-01.cpp QKVcur_silu
        conv_out = _act(xp, conv_in, cfg.conv_activation)
    else:
        put("rec_conv_in", conv_in)
        conv_out = _causal_conv(be, layer, conv_in, slot)
        put("rec_conv", conv_out)
    put("rec_z", _probe_heads(cfg, xp, z))

    if cfg.kind == "short_conv":
        # HF `y = C * conv_out`; lfm2.cpp `ggml_mul(ctx0, c, conv_out)`
        branch = z * conv_out
    else:
        q, k, v, beta, g, v_write, skip = _recurrence_inputs(layer, normed, conv_out, put)
        y = _recur(layer, q, k, v_write, g, beta, slot)  # [n, Hv, Dv], acc
        if skip is not None:
            # HF mamba2_chunk_scan `D_residual` / MambaMixer `hidden_states * D`; mamba-base.cpp
            # `ggml_add(y, ggml_mul(x, ssm_d))` ("mamba2_y_add_d")
            y = y + xp.astype(v, acc, copy=False) * skip
        y = xp.astype(y, be.native_dtype, copy=False)
        put("rec_out", _probe_heads(cfg, xp, y))
        branch = _output_stage(layer, xp.reshape(y, (n, cfg.width)), z)
    put("attn_branch", branch)

    out = _linear(xp, branch, w["wo"], w.get("bo"))
    put("attn_out", out)
    slot.rows += n
    return out


def _causal_conv(be: Backend, layer: RecurrentLayer, rows, slot: kvmod.RecurrentState):
    """The depthwise causal conv of ``rows[n, C]`` over the sequence's last ``K - 1``
    rows (``slot.conv``, zeros before the first call), then its activation; the
    slot keeps the last ``K - 1`` rows of (state ++ rows).

    HF ``causal_conv1d_fn`` / ``causal_conv1d_update`` (``F.conv1d`` with
    ``padding=K-1``, or over ``cat([conv_state, x])``); ggml-cpu ops.cpp
    ``ggml_compute_forward_ssm_conv_f32`` (a dot of each channel's K columns with
    its kernel row) over ``ggml_concat(conv_states, x)`` (delta-net-base.cpp
    ``build_conv_state``, mamba-base.cpp, lfm2.cpp), the last ``K - 1`` columns
    copied back."""
    cfg, xp, w = layer.cfg, be.xp, layer.w
    kk, n = cfg.conv_kernel, rows.shape[0]
    if slot.conv is None:
        slot.conv = xp.zeros((kk - 1, cfg.conv_channels), dtype=rows.dtype, **_dev(be))
    full = xp.concat([slot.conv, rows], axis=0) if kk > 1 else rows  # [K-1+n, C]
    acc = be.acc_dtype
    full_acc = xp.astype(full, acc, copy=False)
    wk = xp.astype(w["conv"], acc, copy=False)
    out = full_acc[0:n] * wk[:, 0]
    for j in range(1, kk):
        out = out + full_acc[j:j + n] * wk[:, j]
    if "conv_b" in w:
        out = out + xp.astype(w["conv_b"], acc, copy=False)
    slot.conv = full[full.shape[0] - (kk - 1):] if kk > 1 else full[0:0]
    return xp.astype(_act(xp, out, cfg.conv_activation), rows.dtype, copy=False)


def _recurrence_inputs(layer: RecurrentLayer, normed, conv_out, put):
    """q, k (at the key heads), v (at the value heads), beta, the log-decay g, the
    v the write uses (mamba: x * dt) and the D skip, per kind, in the accumulation dtype."""
    cfg, be = layer.cfg, layer.backend
    xp, w, acc = be.xp, layer.w, be.acc_dtype
    n = conv_out.shape[0]
    hk, hv, dk, dv = cfg.n_k_heads, cfg.n_v_heads, cfg.k_dim, cfg.v_dim

    def f(a):
        return xp.astype(a, acc, copy=False)

    beta = skip = None
    if cfg.kind in ("gated_delta_net", "kimi_delta", "lightning"):
        # HF `torch.split(mixed_qkv, [key_dim, key_dim, value_dim])` (after the conv);
        # lightning: the silu'd qkv_proj, here already in q|k|v role order
        q = xp.reshape(conv_out[:, : hk * dk], (n, hk, dk))
        k = xp.reshape(conv_out[:, hk * dk: 2 * hk * dk], (n, hk, dk))
        v = xp.reshape(conv_out[:, 2 * hk * dk:], (n, hv, dv))
    elif cfg.kind == "mamba2":
        # HF `torch.split(hidden_states_B_C, [intermediate, G * N, G * N])`: x | B | C; k = B, q = C
        v = xp.reshape(conv_out[:, : hv * dv], (n, hv, dv))
        k = xp.reshape(conv_out[:, hv * dv: hv * dv + hk * dk], (n, hk, dk))
        q = xp.reshape(conv_out[:, hv * dv + hk * dk:], (n, hk, dk))
    else:  # mamba1: HF `x_proj(x)` -> dt | B | C after the conv
        v = xp.reshape(conv_out, (n, hv, 1))
        xdbc = _linear(xp, conv_out, w["w_x_proj"], None)
        r = cfg.dt_rank
        dt_low, bb, cc = xdbc[:, :r], xdbc[:, r: r + dk], xdbc[:, r + dk:]
        if cfg.bc_norm is not None:
            # HF JambaMambaMixer (weighted) / FalconMambaMixer (weightless) dt / B / C norms;
            # mamba-base.cpp `build_norm(dt, ssm_dt_norm, ...)` with the file's rms eps
            dt_low = normalize(xp, dt_low, cfg.bc_norm, w.get("dt_norm"), None, acc)
            bb = normalize(xp, bb, cfg.bc_norm, w.get("b_norm"), None, acc)
            cc = normalize(xp, cc, cfg.bc_norm, w.get("c_norm"), None, acc)
        k, q = xp.reshape(bb, (n, 1, dk)), xp.reshape(cc, (n, 1, dk))
        dt_raw = _linear(xp, dt_low, w["w_dt"], None)  # HF `dt_proj.weight @ time_step`, bias inside the softplus

    q, k = f(q), f(k)
    if cfg.qk_norm == "l2":
        # HF l2norm (qwen3_next `x * rsqrt(sum x^2 + eps)`, kimi `x / sqrt(sum x^2 + eps)`, eps 1e-6 fixed);
        # llama.cpp build_gdn_l2_norm `rms_norm(x, eps / n) / sqrt(n)` = x / sqrt(sum x^2 + eps), eps = rms_norm_eps
        q = q / xp.sqrt(xp.sum(q * q, axis=-1, keepdims=True) + cfg.qk_norm_eps)
        k = k / xp.sqrt(xp.sum(k * k, axis=-1, keepdims=True) + cfg.qk_norm_eps)
    # q / k as both references expose them: after the L2 norm, before the q scale (HF scales inside
    # torch_*_gated_delta_rule, ggml inside gated_delta_net)
    put("rec_q", q[:, 0] if cfg.kind == "mamba1" else q)
    put("rec_k", k[:, 0] if cfg.kind == "mamba1" else k)
    scale = query_scale(cfg)
    if scale != 1.0:
        # HF `query * head_k_dim ** -0.5`; ggml gated_delta_net scales the read (`sum * scale`): the same product
        q = q * scale
    put("rec_v", v[:, :, 0] if cfg.kind == "mamba1" else v)
    vf = f(v)

    if cfg.beta == "sigmoid":
        # HF `beta = b.sigmoid()`; qwen35.cpp `ggml_sigmoid(beta)`
        beta = _sigmoid(xp, f(_linear(xp, normed, w["w_beta"], None)))
        put("rec_beta", beta)
    if cfg.decay_param == "softplus_A":
        # HF Qwen3NextGatedDeltaNet `g = -A_log.float().exp() * softplus(a.float() + dt_bias)`; KimiLinearForgetGate
        # (per key channel: f_b(f_a(x)) + dt_bias, A per head); qwen35.cpp `ggml_mul(softplus(alpha + ssm_dt), ssm_a)`
        a_in = normed if "w_decay_a" not in w else _linear(xp, normed, w["w_decay_a"], None)
        a = f(_linear(xp, a_in, w["w_decay"], None)) + f(w["dt_bias"])
        neg_a = -xp.exp(f(w["A_log"]))
        if cfg.decay == "per_key":
            g = xp.reshape(_softplus(xp, a), (n, hv, dk)) * neg_a[:, None]
        else:
            g = _softplus(xp, a) * neg_a
        put("rec_decay", g)
        v_write = vf
    elif cfg.decay_param == "dt_A":
        if cfg.kind == "mamba2":
            dt_raw = _linear(xp, normed, w["w_decay"], w.get("b_decay"))
            if cfg.proj_multipliers is not None:
                dt_raw = dt_raw * cfg.proj_multipliers[4]  # HF mup_vector's dt segment
        # HF mamba2_chunk_scan / MambaMixer: `dt = softplus(dt + dt_bias)`, then (mamba2's chunk path only)
        # `clamp(dt, *time_step_limit)`; ggml ssm_scan: `ggml_compute_softplus_f32(dt[h])`, no clamp
        dt = _softplus(xp, f(dt_raw) + f(w["dt_bias"]))
        if cfg.dt_limit is not None:
            dt = xp.clip(dt, cfg.dt_limit[0], cfg.dt_limit[1])
        put("rec_decay", dt)
        neg_a = -xp.exp(f(w["A_log"]))
        # dA = exp(dt * A): per head (mamba2, A [H]) or per (channel, state) (mamba1, A [d_inner, N])
        g = dt * neg_a if cfg.decay == "per_head" else dt[:, :, None] * neg_a
        v_write = vf * dt[:, :, None]  # HF `hidden_states * dt[..., None]` / ggml `x_dt = x * dt_soft_plus`
        skip = f(w["D"])[:, None]
    else:  # slope: lightning's constant per-head decay exp(-slope_h)
        g = xp.zeros((n, hv), dtype=acc, **_dev(be)) + be.asarray(layer.log_decay, acc)
        put("rec_decay", g)
        v_write = vf
    return q, k, v, beta, g, v_write, skip


def _recur(layer: RecurrentLayer, q, k, v, g, beta, slot: kvmod.RecurrentState):
    """The recurrence over this call's rows from the slot's state (zeros first), in
    the accumulation dtype; leaves the new state in the slot and returns y."""
    cfg, be = layer.cfg, layer.backend
    xp = be.xp
    hv, dk, dv = cfg.n_v_heads, cfg.k_dim, cfg.v_dim
    if slot.rec is None:
        slot.rec = xp.zeros((hv, dk, dv), dtype=be.acc_dtype, **_dev(be))
    if cfg.n_k_heads != hv:
        # value head h reads key head head_index[h] (RecurrentConfig.head_map)
        q = xp.take(q, layer.head_index, axis=1)
        k = xp.take(k, layer.head_index, axis=1)

    delta = cfg.update == "delta"
    n = q.shape[0]
    steps = chunk_steps(n, cfg.chunk_size) if cfg.scan == "chunked" else [1] * n
    const = None
    if cfg.decay_param == "slope":
        # lightning: the same exp(-slope_h) every row -- the state's multipliers carried across
        # chunks and calls without the drift of a fixed rounded exp(-slope) (recurrent_scan)
        const, slot.decay_residual = recurrent_scan.carried_decays(be, layer.log_decay, steps, slot.decay_residual)
    if cfg.scan == "chunked":
        y, slot.rec = scan_chunked(be, q, k, v, g, beta, slot.rec, delta, cfg.chunk_size, const)
    else:
        y, slot.rec = scan_sequential(be, q, k, v, g, beta, slot.rec, delta, const)
    return y


def _output_stage(layer: RecurrentLayer, y, z):
    """The output norm and gate on ``y[n, W]`` (compute dtype) with ``z[n, W]``, in the
    accumulation dtype, back to the compute dtype.

    - norm then gate: HF ``Qwen3NextRMSNormGated`` (``w * rms(y) * silu(z)``),
      ``KimiLinearRMSNormGated`` (sigmoid), ``MiniMaxLightningAttention`` (``norm``
      over the row, then ``sigmoid(output_gate(x)) *``); qwen35.cpp
      ``build_norm_gated``, kimi-linear.cpp, minimax-01.cpp ``qkv_norm`` / ``g_sigm``.
    - gate then norm: HF ``MambaRMSNormGated`` (``y * silu(z)``, grouped RMS, ``* w``);
      mamba-base.cpp ``swiglu_split`` then the grouped ``build_norm``.
    - gate only: HF ``mamba_selective_scan``'s ``scan_output * silu(z)``; mamba-base.cpp
      ``ggml_swiglu_split(z, y)``.
    """
    cfg, be = layer.cfg, layer.backend
    xp, w, acc = be.xp, layer.w, be.acc_dtype
    n = y.shape[0]
    yf = xp.astype(y, acc, copy=False)
    gate = _act(xp, xp.astype(z, acc, copy=False), cfg.gate_act)
    if cfg.gate_order == "gate_then_norm":
        yf = yf * gate
    if cfg.norm_groups:
        gs = cfg.width // cfg.norm_groups
        yg = xp.reshape(yf, (n, cfg.norm_groups, gs))
        yg = yg / xp.sqrt(xp.mean(yg * yg, axis=-1, keepdims=True) + cfg.out_norm_eps)
        wn = xp.astype(w["out_norm"], acc, copy=False)
        yf = xp.reshape(yg * (wn if cfg.out_norm_groups is None else xp.reshape(wn, (cfg.norm_groups, gs))),
                        (n, cfg.width))
    if cfg.gate_order != "gate_then_norm":
        yf = yf * gate
    return xp.astype(yf, be.native_dtype, copy=False)


def _put_states(cfg: RecurrentConfig, be: Backend, slot: kvmod.RecurrentState, trace) -> None:
    """The state after this call, in the canonical (HF cache) layout: RECURRENT_STATES."""
    xp = be.xp
    if slot.conv is not None:
        trace.put_state("state_conv", xp.matrix_transpose(slot.conv))  # [C, K-1]
    if slot.rec is not None:
        s = slot.rec  # [Hv, Dk, Dv]
        if cfg.kind == "mamba2":
            s = xp.matrix_transpose(s)  # HF [H, head_dim, N]
        elif cfg.kind == "mamba1":
            s = s[:, :, 0]  # HF [d_inner, N]
        trace.put_state("state_rec", s)


def _probe_heads(cfg: RecurrentConfig, xp, a):
    """A value-head-wide row in its probe layout: [T, Hv, Dv] (mamba1 and short conv: [T, width])."""
    if cfg.kind in ("mamba1", "short_conv"):
        return xp.reshape(a, (a.shape[0], cfg.width))
    return xp.reshape(a, (a.shape[0], cfg.n_v_heads, cfg.v_dim))


def _act(xp, x, name: str):
    if name == "silu":
        return x * _sigmoid(xp, x)
    if name == "sigmoid":
        return _sigmoid(xp, x)
    return x


def _softplus(xp, x):
    """``log(1 + exp(x))``, and ``x`` itself above 20 (torch ``F.softplus`` threshold,
    HF KimiLinearForgetGate's ``where(g > 20, g, ...)``, ggml ``ggml_compute_softplus_f32``)."""
    return xp.where(x > 20.0, x, xp.log1p(xp.exp(xp.clip(x, max=20.0))))
