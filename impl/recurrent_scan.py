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
"""

from __future__ import annotations

import numpy as np

from .ops import device_kw as _dev
from .ops import solve_unit_lower


def scan_sequential(be, q, k, v, g, beta, s, delta: bool):
    """``q, k [T, Hv, Dk]``, ``v [T, Hv, Dv]``, ``g [T, Hv]`` or ``[T, Hv, Dk]``,
    ``beta [T, Hv]`` or None, ``s [Hv, Dk, Dv]`` -> ``(y [T, Hv, Dv], s)``."""
    xp = be.xp
    per_key = g.ndim == 3
    a = xp.exp(g)
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


def scan_chunked(be, q, k, v, g, beta, s, delta: bool, chunk: int):
    """``scan_sequential``'s recurrence, ``chunk`` rows at a time (module docstring)."""
    xp = be.xp
    acc = s.dtype
    per_key = g.ndim == 3
    n = q.shape[0]
    ys = []
    for a in range(0, n, chunk):
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
