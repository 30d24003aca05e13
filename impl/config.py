"""What one attention layer computes, as data.

The specification (`spec/attn_block.rs.txt`) keeps every decoration of the
attention half of a decoder layer in ONE body and lets the data say which
decorations a layer has. This module is that data: a `LayerConfig` per layer,
frozen, validated at construction so an impossible shape is refused before any
arithmetic runs (and the harness can turn the refusal into a one-line error).

Weights are not here; they live beside the config in a plain dict (see
`impl.attention.LAYER_WEIGHTS`). Presence of a weight is what turns a
decoration on where the spec says "the tensor decides" (sinks, biases, sub-norm,
post-norm), and a config field where the spec reads a hyper-parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

NormKind = Literal["rms", "rms1p", "layer", "l2", "none"]
RopeLayout = Literal["neox", "interleaved"]
AttnShape = Literal["gqa", "linear", "absent"]
WindowKind = Literal["sliding", "chunked"]


class ConfigError(ValueError):
    """An impossible or inconsistent layer description (one line, names the valid choices)."""


@dataclass(frozen=True)
class NormSpec:
    """One normalisation.

    kind: ``rms`` (x / rms(x) * w, HF ``LlamaRMSNorm``), ``rms1p`` (gemma's
    ``(1 + w)`` convention, HF ``Gemma2RMSNorm``), ``layer`` (mean-centred, with
    weight and bias, ``nn.LayerNorm``), ``l2`` (rms without a weight, HF
    ``Llama4TextL2Norm``), ``none``.
    """

    kind: NormKind = "rms"
    eps: float = 1e-6

    def __post_init__(self):
        if self.kind not in ("rms", "rms1p", "layer", "l2", "none"):
            raise ConfigError(f"unknown norm kind {self.kind!r}; valid: rms, rms1p, layer, l2, none")


@dataclass(frozen=True)
class RopeSpec:
    """RoPE for one layer.

    ``inv_freq`` holds one inverse frequency per rotated pair (length
    ``rotary_dim // 2``), already scaled by whatever RoPE scaling the model
    declares (``impl.rope.inverse_frequencies`` computes it, mirroring HF
    ``modeling_rope_utils``). ``attention_factor`` multiplies cos and sin (YaRN's
    mscale; HF ``*RotaryEmbedding.forward``: ``cos = emb.cos() * attention_scaling``).
    ``rotary_dim`` leading channels of each head rotate; the rest pass through
    (partial rotary, HF ``partial_rotary_factor``).
    """

    inv_freq: tuple[float, ...]
    layout: RopeLayout = "neox"
    attention_factor: float = 1.0
    kind: str = "default"  # the scaling that produced inv_freq (a label for reports)
    theta: float = 0.0  # the base it was computed from (a label for reports)

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    def __post_init__(self):
        if self.layout not in ("neox", "interleaved"):
            raise ConfigError(f"unknown RoPE layout {self.layout!r}; valid: neox, interleaved")
        if not self.inv_freq:
            raise ConfigError("RoPE with zero rotated channels; use rope=None for a NoPE layer")


@dataclass(frozen=True)
class WindowSpec:
    """Which earlier keys a query may read, as a function of the query's position.

    ``sliding``: keys with ``q_pos - k_pos < size`` (HF's sliding window, which
    counts the query itself). ``chunked``: keys in the query's own chunk of
    ``size`` positions (llama4 ``attention_chunk_size``; spec
    ``layer_window_for_query``: the window depends on the query position).
    """

    kind: WindowKind
    size: int

    def __post_init__(self):
        if self.kind not in ("sliding", "chunked"):
            raise ConfigError(f"unknown window kind {self.kind!r}; valid: sliding, chunked")
        if self.size < 1:
            raise ConfigError(f"window size must be >= 1, got {self.size}")

    def lowest_visible(self, q_pos):
        """Lowest key position a query at ``q_pos`` reads (works on ints and integer arrays)."""
        if self.kind == "sliding":
            return q_pos - self.size + 1
        return (q_pos // self.size) * self.size


@dataclass(frozen=True)
class QkNormSpec:
    """A norm on Q and K.

    ``over``: ``head`` normalises each head's ``head_dim`` channels with a
    ``[head_dim]`` weight (qwen3, HF ``q_norm``); ``row`` normalises the whole
    ``n_heads * head_dim`` row with a row-wide weight (olmo2). ``where``: before
    RoPE (qwen3, olmo2, gemma3) or after it (llama4's L2 norm; the spec's
    ``qk_norm_after_rope`` explains the second home).
    """

    norm: NormSpec
    over: Literal["head", "row"] = "head"
    where: Literal["pre_rope", "post_rope"] = "pre_rope"


@dataclass(frozen=True)
class TemperatureSpec:
    """llama4 attention temperature tuning (HF ``Llama4TextAttention.forward``):
    ``q *= log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1`` per query position."""

    floor_scale: float
    attn_scale: float


@dataclass(frozen=True)
class LayerConfig:
    """The attention half of one decoder layer."""

    hidden_size: int
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int | None = None  # None: same as head_dim
    shape: AttnShape = "gqa"
    input_norm: NormSpec = field(default_factory=NormSpec)
    qkv_clamp: float | None = None
    qk_norm: QkNormSpec | None = None
    rope: RopeSpec | None = None  # None: a NoPE layer
    scale: float | None = None  # softmax scale on q.k; None: head_dim ** -0.5
    temperature: TemperatureSpec | None = None
    window: WindowSpec | None = None
    softcap: float | None = None
    alibi_max_bias: float | None = None  # ALiBi on, with this max bias (8.0 for bloom/mpt)
    # The two gates of the spec's ``attn_branch_rows``, independent (a layer may have
    # both): the interleaved Q gate rides in ``wq`` (``AttnWeights::q_gate_interleaved``,
    # qwen35.cpp) and is applied first; the output gate is a separate projection
    # ``wg`` of the normed input (``AttnWeights::output_gate``, afmoe.cpp).
    q_gate_interleaved: bool = False
    output_gate: bool = False
    sub_norm: NormSpec | None = None  # bitnet: RMS over the concatenated heads before wo
    o_scale: float | None = None  # `wo_s`, the {1} companion of wo
    value_scale: float | None = None  # mimo-v2-flash: branch scaled after wo
    post_norm: NormSpec | None = None  # gemma2/olmo2: norm of the branch before the residual
    residual: Literal["sequential", "parallel"] = "sequential"
    residual_multiplier: float = 1.0  # granite: resid + branch * m

    def __post_init__(self):
        if self.hidden_size < 1:
            raise ConfigError(f"hidden_size must be >= 1, got {self.hidden_size}")
        if self.shape not in ("gqa", "linear", "absent"):
            raise ConfigError(f"unknown attention shape {self.shape!r}; valid: gqa, linear, absent")
        if self.shape != "gqa":
            return
        if self.n_heads < 1 or self.n_kv_heads < 1 or self.head_dim < 1:
            raise ConfigError(
                f"a gqa layer needs n_heads, n_kv_heads, head_dim >= 1 "
                f"(got {self.n_heads}, {self.n_kv_heads}, {self.head_dim})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"num_key_value_heads={self.n_kv_heads} does not divide num_attention_heads={self.n_heads}; "
                f"valid: a divisor of {self.n_heads} ({', '.join(map(str, divisors(self.n_heads)))})"
            )
        if self.rope is not None:
            if self.rope.rotary_dim > self.head_dim:
                raise ConfigError(f"rotary_dim {self.rope.rotary_dim} exceeds head_dim {self.head_dim}")
        for name in ("q_gate_interleaved", "output_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.q_gate_interleaved and self.dv != self.head_dim:
            # spec split_interleaved_q_gate(q, rows, n_heads, head_dim) makes the gate
            # head_dim wide per head; apply_interleaved_gate multiplies it element by
            # element onto the V-width head output (qwen35.cpp: ggml_mul of the
            # [head_dim * n_head] gate and the [v_head_dim * n_head] kqv_out)
            raise ConfigError(f"the interleaved Q gate is head_dim={self.head_dim} wide per head and multiplies the "
                              f"attention output of width v_head_dim={self.dv}; valid: v_head_dim equal to head_dim")
        if self.residual not in ("sequential", "parallel"):
            raise ConfigError(f"unknown residual layout {self.residual!r}; valid: sequential, parallel")

    @property
    def dv(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5 if self.scale is None else self.scale

    def replace(self, **kw) -> "LayerConfig":
        return replace(self, **kw)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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
