"""impl's arithmetic of a recurrent layer description.

The description itself (``RecurrentConfig``, its kinds and their defaults) is
the contract every candidate is handed (``contract.recurrent``: frozen,
validated at construction); impl re-exports it. What its fields COMPUTE is
impl's own and lives here, so no oracle shares it: the q scale a
``q_scale=None`` layer uses, which key head each value head reads
(``head_map``), lightning attention's per-head decay slopes.
"""

from __future__ import annotations

from contract.recurrent import KIND_DEFAULTS, RECURRENT_KINDS, SCANS, RecurrentConfig  # noqa: F401 (re-exported)

from .config import ConfigError


def query_scale(cfg: RecurrentConfig) -> float:
    """The scale on q: the layer's own, or ``Dk ** -0.5`` for the delta-rule kinds
    (HF ``torch_*_gated_delta_rule`` ``query * head_k_dim ** -0.5``; ggml
    ``gated_delta_net`` scales the read by ``1 / sqrt(S_k)``) and 1 for the others."""
    if cfg.q_scale is not None:
        return cfg.q_scale
    return cfg.k_dim**-0.5 if cfg.update == "delta" else 1.0


def head_index(cfg: RecurrentConfig) -> list[int]:
    """The key head each value head reads (``head_map``): ``grouped`` ``h // (Hv /
    Hk)`` (HF ``repeat_interleave``), ``tiled`` ``h % Hk`` (ggml
    ``gated_delta_net``'s ``iq1 = iv1 % neq1``, qwen35.cpp)."""
    hk, hv = cfg.n_k_heads, cfg.n_v_heads
    return [h // (hv // hk) if cfg.head_map == "grouped" else h % hk for h in range(hv)]


def lightning_slopes(n_heads: int, layer_idx: int, n_layers: int, rule: str = "hf") -> tuple[float, ...]:
    """Lightning attention's per-head decay slopes, ``base ** (h + 1) * factor`` with
    ``base = 2 ** (-8 / n_heads)``. The references differ in the layer factor:

    - ``hf``: ``1 - il / (n_layers - 1 + 1e-5) + 1e-5`` (HF modeling_minimax.py
      ``MiniMaxLightningAttention.get_slope_rate``);
    - ``llamacpp``: ``1 - il / (n_layers - 1) + 1e-5`` (minimax-01.cpp, ``slope_scale``;
      a 1-layer model divides by zero there).
    """
    if rule not in ("hf", "llamacpp"):
        raise ConfigError(f"unknown lightning slope rule {rule!r}; valid: hf, llamacpp")
    base = 1.0 / (2.0 ** (8.0 / n_heads))
    if rule == "hf":
        factor = 1.0 - layer_idx / (n_layers - 1 + 1e-5) + 1e-5
    else:
        if n_layers < 2:
            raise ConfigError("llama.cpp's lightning slope divides by n_layers - 1; valid: n_layers >= 2")
        factor = 1.0 - layer_idx / (n_layers - 1) + 1e-5
    return tuple(float(base ** (h + 1) * factor) for h in range(n_heads))

