"""The recurrence of ``impl.recurrent``, in its two forms (``RecurrentConfig.scan``).

Per value head ``h``, over the state ``S[h]`` of ``[Dk, Dv]`` and the call's rows
``t``, all in the accumulation dtype::

    S = exp(g_t) * S                      g_t [Hv] per head, or [Hv, Dk] per key channel (scales S's rows)
    u = beta_t * (v_t - S^T k_t)          delta rule (beta None: 1)
    u = beta_t * v_t                      plain write
    S = S + k_t u^T
    y_t = S^T q_t

This is HF ``torch_recurrent_gated_delta_rule`` / ``recurrent_kimi_delta_attention``
(decay, read ``kv_mem``, ``delta``, write, read the output), ggml-cpu ops.cpp
``ggml_compute_forward_gated_delta_net_one_chunk`` (the same steps on the
transposed state), and -- with the plain write -- ggml ``ssm_scan`` and HF
``mamba_selective_state_update`` / ``MiniMaxLightningAttention``'s per-token loop.

- ``scan_sequential``: one row after another (the references' decode paths and
  ggml's kernels).
- ``scan_chunked``: ``chunk`` rows at a time in the WY / UT form (HF
  ``torch_chunk_gated_delta_rule``, ``chunk_kimi_delta_attention``; llama.cpp
  delta-net-base.cpp ``build_delta_net_chunking``; for the plain write, the
  SSD chunk scan of HF ``mamba2_chunk_scan`` and lightning's block form):
  within a chunk, with ``G`` the cumulative log-decay from the chunk's start
  and ``Dm[i, j] = exp(G_i - G_j)`` for ``j <= i``,

      A = strict_lower(beta_i (k_i . k_j) Dm)          (per key channel: sum_d k_i[d] k_j[d] Dm[i, j, d])
      U = (I + A)^-1 (beta v),  W = (I + A)^-1 (beta k exp(G))      (delta rule; plain: U = beta v, W = 0)
      v_new = U - W S0
      y = (q exp(G)) S0 + lower(q_i . k_j Dm) v_new
      S = exp(G_last) S0 + (k exp(G_last - G))^T v_new

  Every exponent is <= 0 (g <= 0), so nothing overflows. The chunks start at the
  call's first row, as HF's do: the same recurrence, rounded differently.

A decay that is the same every row (lightning's ``exp(-slope_h)``: ``const_decay``)
is taken in the form the references compute it, never by accumulation:

- inside a chunk, HF ``MiniMaxLightningAttention.decay_factors``: each factor is
  ``exp(g * n)`` of ONE product of the log-decay and an integer row count
  (``query_decay`` ``n = i + 1``, ``key_decay`` ``n = m - 1 - i``,
  ``diagonal_decay`` ``n = i - j``), where a cumulative sum of ``g`` rounds
  once per row and ``G_i - G_j`` cancels;
- the state's decay between chunks and between calls (``carried_decays``): a
  float32 ``fl(exp(g))`` multiplied into the state once per row (HF's cached
  path ``ratio * attn_weights_inter``, ggml's per-ubatch ``block_decay``) is off
  by a FIXED relative ``delta <= 2^-24``, and a contribution ``t`` rows old is
  then off by ``t * delta`` -- coherent, growing with the length (measured: impl's
  float32 decode schedule 15-370x HF's float32 block form's distance to the
  float64 oracle at 300 tokens, the minimax false alarm of
  docs/measurements/2026-12-01-minimax.md). Each multiplier here is instead
  rounded from the exact decay divided by what the previous multipliers
  realised (``residual``, float64 on the host, one number per head carried in
  the sequence's state), so the realised product of every run of multipliers
  stays within two roundings of ``exp(g * rows)``: the error left is the state's
  own per-row rounding, random in sign (1.1-3.1x HF's distance at 300 rows, one
  row per call, tests/test_lightning_scan.py).
"""

from __future__ import annotations

import numpy as np

from .ops import device_kw as _dev
from .ops import solve_unit_lower


def carried_decays(be, g0, steps, residual):
    """The state's multipliers for runs of ``steps`` rows of a per-head log-decay ``g0``
    (host float64 ``[Hv]``, the same every row), in the accumulation dtype, and the
    residual to carry to the next call (module docstring): multiplier ``r`` is
    ``fl(exp(g0 * steps[r]) / residual)``, then ``residual *= fl(...) / exact``, all on
    the host. ``residual`` None: the sequence's first call (1). Returns
    ``([R, Hv] on the backend, residual)``."""
    acc = np.float64 if be.dtype == "float64" else np.float32  # Backend.acc_dtype, as NumPy holds it
    res = np.ones_like(g0) if residual is None else residual
    exact = np.exp(g0[None, :] * np.asarray(steps, dtype=np.float64)[:, None])  # [R, Hv]
    out = np.empty_like(exact)
    for r in range(exact.shape[0]):
        out[r] = (exact[r] / res).astype(acc)
        # an exact decay past the accumulation dtype's normal range (a slope times a row count
        # over ~87 in float32) leaves nothing of the old state to correct: start over at 1
        ok = out[r] >= np.finfo(acc).tiny
        res = np.where(ok, res * out[r] / np.where(ok, exact[r], 1.0), 1.0)
    return be.asarray(out, be.acc_dtype), res


def scan_sequential(be, q, k, v, g, beta, s, delta: bool, const_decay=None):
    """``q, k [T, Hv, Dk]``, ``v [T, Hv, Dv]``, ``g [T, Hv]`` or ``[T, Hv, Dk]``,
    ``beta [T, Hv]`` or None, ``s [Hv, Dk, Dv]`` -> ``(y [T, Hv, Dv], s)``.
    ``const_decay``: ``[T, Hv]`` the state's multiplier per row where the decay is the
    same every row (``carried_decays``), in place of ``exp(g)``."""
    xp = be.xp
    per_key = g.ndim == 3
    a = xp.exp(g) if const_decay is None else const_decay
    ys = []
    for t in range(q.shape[0]):
        s = s * (a[t][:, :, None] if per_key else a[t][:, None, None])
        kt = k[t]
        if delta:
            kv = xp.matmul(kt[:, None, :], s)[:, 0, :]  # S^T k: [Hv, Dv]
            u = v[t] - kv
        else:
            u = v[t]
        if beta is not None:
            u = u * beta[t][:, None]
        s = s + kt[:, :, None] * u[:, None, :]
        ys.append(xp.matmul(q[t][:, None, :], s)[:, 0, :])
    return xp.stack(ys, axis=0), s


def chunk_steps(n: int, chunk: int) -> list[int]:
    """The rows of each chunk of an ``n``-row call (the chunks start at its first row)."""
    return [min(chunk, n - a) for a in range(0, n, chunk)]


def scan_chunked(be, q, k, v, g, beta, s, delta: bool, chunk: int, const_decay=None):
    """``scan_sequential``'s recurrence, ``chunk`` rows at a time (module docstring).
    ``const_decay``: ``[chunks, Hv]`` the state's multiplier per chunk where the decay is
    the same every row (``carried_decays`` over ``chunk_steps``); the decays inside a
    chunk are then HF's ``decay_factors`` products of ``g`` and a row count."""
    xp = be.xp
    acc = s.dtype
    per_key = g.ndim == 3
    n = q.shape[0]
    ys = []
    for c, a in enumerate(range(0, n, chunk)):
        b = min(n, a + chunk)
        m = b - a
        qh = xp.permute_dims(q[a:b], (1, 0, 2))  # [Hv, m, Dk]
        kh = xp.permute_dims(k[a:b], (1, 0, 2))
        vh = xp.permute_dims(v[a:b], (1, 0, 2))  # [Hv, m, Dv]
        gh = xp.permute_dims(g[a:b], (1, 0, 2) if per_key else (1, 0))  # [Hv, m(, Dk)]
        cg = xp.cumulative_sum(gh, axis=1)  # G: [Hv, m(, Dk)]
        lower = be.mask(np.tril(np.ones((m, m), dtype=bool)))  # j <= i
        strict = be.mask(np.tril(np.ones((m, m), dtype=bool), -1))  # j < i
        neg_inf = xp.asarray(-np.inf, dtype=acc, **_dev(be))
        zero = xp.asarray(0.0, dtype=acc, **_dev(be))
        if per_key:
            diff = cg[:, :, None, :] - cg[:, None, :, :]  # [Hv, m, m, Dk]
            dm = xp.exp(xp.where(lower[None, :, :, None], diff, neg_inf))
            kk = xp.sum(kh[:, :, None, :] * kh[:, None, :, :] * dm, axis=-1)  # [Hv, m, m]
            qk = xp.sum(qh[:, :, None, :] * kh[:, None, :, :] * dm, axis=-1)
            eg = xp.exp(cg)  # [Hv, m, Dk]
            q_dec, k_dec = qh * eg, kh * eg
            last = cg[:, m - 1:m, :]  # [Hv, 1, Dk]
            k_rest = kh * xp.exp(last - cg)
            s_dec = xp.exp(last[:, 0, :])[:, :, None]  # rows of S: [Hv, Dk, 1]
        elif const_decay is not None:
            # HF decay_factors: exp(-slope * n), one product of the slope and a row count each
            # (query_decay n = i + 1, key_decay n = m - 1 - i, diagonal_decay n = i - j)
            g0 = g[a][:, None]  # [Hv, 1]
            rows = be.asarray(np.arange(1, m + 1), acc)  # i + 1
            offs = be.asarray(np.subtract.outer(np.arange(m), np.arange(m)), acc)  # i - j
            dm = xp.exp(xp.where(lower[None], g0[:, :, None] * offs[None], neg_inf))
            kk = xp.matmul(kh, xp.matrix_transpose(kh)) * dm
            qk = xp.matmul(qh, xp.matrix_transpose(kh)) * dm
            eg = xp.exp(g0 * rows[None])[:, :, None]  # [Hv, m, 1]
            q_dec, k_dec = qh * eg, kh * eg
            k_rest = kh * xp.exp(g0 * (m - rows)[None])[:, :, None]
            s_dec = const_decay[c][:, None, None]  # [Hv, 1, 1]
        else:
            diff = cg[:, :, None] - cg[:, None, :]  # [Hv, m, m]
            dm = xp.exp(xp.where(lower[None], diff, neg_inf))
            kk = xp.matmul(kh, xp.matrix_transpose(kh)) * dm
            qk = xp.matmul(qh, xp.matrix_transpose(kh)) * dm
            eg = xp.exp(cg)[:, :, None]  # [Hv, m, 1]
            q_dec, k_dec = qh * eg, kh * eg
            last = cg[:, m - 1:m]  # [Hv, 1]
            k_rest = kh * xp.exp(last - cg)[:, :, None]
            s_dec = xp.exp(last)[:, :, None]  # [Hv, 1, 1]
        bt = None if beta is None else xp.permute_dims(beta[a:b], (1, 0))[:, :, None]  # [Hv, m, 1]
        vb = vh if bt is None else vh * bt
        if delta:
            kb = k_dec if bt is None else k_dec * bt
            amat = xp.where(strict[None], kk if bt is None else kk * bt, zero)
            eye = xp.eye(m, dtype=acc, **_dev(be))
            sol = solve_unit_lower(be, eye + amat, xp.concat([vb, kb], axis=-1))  # one solve for U | W
            dv = vh.shape[-1]
            v_new = sol[..., :dv] - xp.matmul(sol[..., dv:], s)
        else:
            v_new = vb
        y = xp.matmul(q_dec, s) + xp.matmul(xp.where(lower[None], qk, zero), v_new)  # [Hv, m, Dv]
        s = s * s_dec + xp.matmul(xp.matrix_transpose(k_rest), v_new)
        ys.append(xp.permute_dims(y, (1, 0, 2)))
    return (ys[0] if len(ys) == 1 else xp.concat(ys, axis=0)), s
