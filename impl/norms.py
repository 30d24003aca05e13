"""Normalisations, written once over the array namespace.

Where the reduction runs and where the weight is applied follow HF, so the
low-precision paths round where HF rounds:
- ``rms``: HF ``LlamaRMSNorm.forward`` -- statistics in float32, back to the
  input dtype, THEN times the weight.
- ``rms1p``: HF ``Gemma2RMSNorm.forward`` -- everything in float32, ``(1 + w)``,
  then back to the input dtype.
- ``layer``: ``nn.LayerNorm`` (mean-centred, weight and bias).
- ``l2``: HF ``Llama4TextL2Norm`` -- rms without a weight.
"""

from __future__ import annotations

from .config import NormSpec


def normalize(xp, x, spec: NormSpec, weight=None, bias=None, acc_dtype=None):
    if spec.kind == "none":
        return x
    in_dtype = x.dtype
    # copy=False throughout: an astype to the type the array has is no pass over it
    xf = x if acc_dtype is None else xp.astype(x, acc_dtype, copy=False)
    if spec.kind == "layer":
        mean = xp.mean(xf, axis=-1, keepdims=True)
        xf = xf - mean
    var = xp.mean(xf * xf, axis=-1, keepdims=True)
    y = xf / xp.sqrt(var + spec.eps)
    if spec.kind == "rms1p":
        w = weight if acc_dtype is None else xp.astype(weight, acc_dtype, copy=False)
        return xp.astype(y * (1.0 + w), in_dtype, copy=False)
    y = xp.astype(y, in_dtype, copy=False)
    if spec.kind == "l2":
        return y
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
