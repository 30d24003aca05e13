"""Small array helpers the attention bodies share (one place, not one per body)."""

from __future__ import annotations


def linear(xp, x, w, b=None):
    """``x @ w.T (+ b)`` with ``w`` in nn.Linear layout ``[out, in]``."""
    y = xp.matmul(x, xp.matrix_transpose(w))
    return y if b is None else y + b


def sigmoid(xp, x):
    return 1.0 / (1.0 + xp.exp(-x))


def softplus(xp, x, acc_dtype=None):
    """``log(1 + exp(x))`` in the accumulation type (HF laguna: ``F.softplus(g.float())``),
    the overflow-free form ``max(x, 0) + log1p(exp(-|x|))``, back to the input's type."""
    xf = x if acc_dtype is None else xp.astype(x, acc_dtype, copy=False)
    y = xp.maximum(xf, xp.zeros_like(xf)) + xp.log1p(xp.exp(-xp.abs(xf)))
    return xp.astype(y, x.dtype, copy=False)


def device_kw(be) -> dict:
    """``device=`` for array constructors: NumPy has no devices."""
    return {} if be.name == "numpy" else {"device": be.device}


def noop(*_a, **_k):
    return None


def solve_unit_lower(be, m, b):
    """``m^-1 b`` for a batch of unit lower-triangular ``m [..., n, n]``: the UT / WY
    transform of the chunked recurrence (HF ``torch_chunk_gated_delta_rule``:
    ``torch.linalg.solve_triangular(..., upper=False, unitriangular=True)``; llama.cpp
    ``ggml_solve_tri``). The array API has no triangular solve: torch's is used where
    the namespace is torch's (a third of the general solve's time), the general
    ``linalg.solve`` elsewhere (the same answer: the matrix is unit lower-triangular)."""
    if be.name == "torch":
        return be.torch.linalg.solve_triangular(m, b, upper=False, unitriangular=True)
    return be.xp.linalg.solve(m, b)
