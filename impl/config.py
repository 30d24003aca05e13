"""What one attention layer computes, as data -- and impl's arithmetic of it.

The descriptions themselves (``LayerConfig`` and its specs) are the contract
every candidate is handed (``contract.layers``: frozen, validated at
construction); impl re-exports them. What their fields COMPUTE is impl's own
and lives here, so no oracle shares it: the softmax scale a ``scale=None``
layer uses, the lowest key a window lets a query read, ALiBi's slopes.

Weights are not here; they live beside the config in a plain dict (see
``impl.attention.LAYER_WEIGHTS``). Presence of a weight is what turns a
decoration on where the spec says "the tensor decides" (sinks, biases, sub-norm,
post-norm), and a config field where the spec reads a hyper-parameter.
"""

from __future__ import annotations

import math

from contract.errors import ConfigError  # noqa: F401 (re-exported)
from contract.layers import (  # noqa: F401 (re-exported)
    AttnShape,
    LayerConfig,
    NormKind,
    NormSpec,
    QkNormSpec,
    RopeLayout,
    RopeSpec,
    TemperatureSpec,
    WindowKind,
    WindowSpec,
    divisors,
)


def softmax_scale(cfg: LayerConfig) -> float:
    """The scale on q.k: the layer's own, or ``head_dim ** -0.5`` (HF ``self.scaling``)."""
    return cfg.head_dim**-0.5 if cfg.scale is None else cfg.scale


def lowest_visible(window: WindowSpec, q_pos):
    """Lowest key position a query at ``q_pos`` reads (works on ints and integer
    arrays): HF's sliding window counts the query itself; a chunk starts at the
    multiple of its size (spec ``layer_window_for_query``)."""
    if window.kind == "sliding":
        return q_pos - window.size + 1
    return (q_pos // window.size) * window.size


def alibi_slopes(n_heads: int, max_bias: float = 8.0) -> list[float]:
    """Per-head ALiBi slopes, including head counts that are not a power of two.

    Mirrors llama.cpp's ``ggml_soft_max`` slope rule (ggml-cpu ops.cpp:
    ``m0 = 2^(-max_bias / n_head_log2)``, ``m1 = 2^(-max_bias / 2 / n_head_log2)``,
    heads past ``n_head_log2`` take odd powers of ``m1``), which equals HF
    ``build_alibi_tensor`` (bloom) for ``max_bias = 8``.
    """
    n_log2 = 2 ** math.floor(math.log2(n_heads))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-max_bias / 2.0 / n_log2)
    return [m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_heads)]
