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
