"""The Mamba-2 mixer as every family that has one describes it (HF ``Mamba2Mixer``
and its copies ``BambaMixer``, ``GraniteMoeHybridMambaLayer``, ``NemotronHMamba2Mixer``; llama.cpp
mamba-base.cpp ``build_mamba2_layer``; converter conversion/mamba.py
``Mamba2Model.modify_tensors``): one body, the families differ only in the HF
config names of its sizes (``Mamba2Sizes``) and where the mixer sits in the layer.
The functions are the body; ``Mamba2Mixer`` is the same body as a family mix-in
(nemotron_h), parameterised by ``mamba2_sizes`` and ``mamba2_module``.

HF: ``in_proj`` -> z | xBC | dt (``projected_states.split([intermediate, conv_dim,
num_heads])``), the SiLU causal conv with bias over xBC, x | B | C (v = x, k = B,
q = C over ``n_groups`` groups), ``dt = softplus(dt + dt_bias)`` (clamped to
``time_step_limit`` in the chunked scan only), the per-head decay, the D skip, the
gated grouped RMS norm (``*RMSNormGated(intermediate, group_size=intermediate //
n_groups)``: gate, then norm per group), ``out_proj``.

llama.cpp names only ``mamba2_y_add_d`` and ``mamba_out`` inside the layer; the
conv and SSM states come from ``llama_state_seq_get_data``.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.recurrent import RecurrentConfig

from ..errors import UsageError
from .base import LcPoint, Point, tensor

# what build_mamba2_layer leaves unnamed (views and ops with no cb())
LC_NOT_EXPOSED = {p: "mamba-base.cpp build_mamba2_layer names no tensor inside the layer but mamba2_y_add_d and "
                     "mamba_out (the in-projection, conv, x / B / C, dt and the gated norm are unnamed views and "
                     "ops); the conv and SSM states are read from llama_state_seq_get_data instead"
                  for p in ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay",
                            "attn_branch")}
# build_mamba2_layer's cb() names (the graph's attn_norm before it)
LC_POINTS = {
    "attn_in": LcPoint("attn_norm"),
    "rec_out": LcPoint("mamba2_y_add_d", "last", "heads"),
    "attn_out": LcPoint("mamba_out"),
}

# HF's block around the mixer (Mamba2Block / NemotronHBlock.forward): norm -> mixer ->
# residual + mixer out, no FFN half, so the block's output is the residual after the branch
HF_BLOCK_POINTS = {
    "layer_in": Point("", "in"),
    "attn_in": Point("mixer", "in"),
    "attn_branch": Point("mixer.out_proj", "in"),
    "attn_out": Point("mixer", "out"),
    "resid_mid": Point("", "out"),
    "layer_out": Point("", "out"),
}


@dataclass(frozen=True)
class Mamba2Sizes:
    """One Mamba-2 mixer's sizes and switches, whatever the HF config calls them."""

    heads: int
    head_dim: int
    groups: int
    state: int
    conv: int
    conv_bias: bool
    proj_bias: bool
    eps: float
    chunk: int
    limit: tuple[float, float] | None

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state


def mamba2_config(s: Mamba2Sizes, hidden: int, input_norm, residual_beta: float = 1.0) -> RecurrentConfig:
    """The mixer as impl's ``mamba2`` kind: heads of ``head_dim``, B / C over ``groups``
    groups of ``state``, the gated norm over ``groups`` groups; ``residual_beta``: a
    multiplier on the branch before the residual add (granite's ``residual_multiplier``)."""
    lim = None if s.limit is None or tuple(s.limit) == (0.0, float("inf")) else tuple(float(x) for x in s.limit)
    return RecurrentConfig.of(
        "mamba2", hidden_size=hidden, n_k_heads=s.groups, n_v_heads=s.heads, k_dim=s.state, v_dim=s.head_dim,
        conv_kernel=s.conv, conv_bias=s.conv_bias, in_bias=s.proj_bias, out_bias=s.proj_bias,
        out_norm_groups=s.groups, out_norm_eps=s.eps, dt_limit=lim, chunk_size=s.chunk, input_norm=input_norm,
        residual_beta=float(residual_beta))


def mamba2_weights(layer, mixer: str, norm: str | None, s: Mamba2Sizes) -> dict:
    """impl's weights of the mixer at ``mixer`` (relative to the decoder layer) with the
    layer's input norm at ``norm`` (None: the family adds it): ``in_proj`` split z | xBC |
    dt as HF splits it."""
    di, cd = s.inner, s.conv_dim
    w_in = tensor(layer, f"{mixer}.in_proj.weight")
    w = {"w_z": w_in[:di], "w_in": w_in[di:di + cd],
         "w_decay": w_in[di + cd:], "conv": tensor(layer, f"{mixer}.conv1d.weight")[:, 0],
         "dt_bias": tensor(layer, f"{mixer}.dt_bias"), "A_log": tensor(layer, f"{mixer}.A_log"),
         "D": tensor(layer, f"{mixer}.D"), "out_norm": tensor(layer, f"{mixer}.norm.weight"),
         "wo": tensor(layer, f"{mixer}.out_proj.weight")}
    if norm is not None:
        w["attn_norm"] = tensor(layer, f"{norm}.weight")
    if s.conv_bias:
        w["conv_b"] = tensor(layer, f"{mixer}.conv1d.bias")
    if s.proj_bias:
        b = tensor(layer, f"{mixer}.in_proj.bias")
        w.update(b_z=b[:di], b_in=b[di:di + cd], b_decay=b[di + cd:], bo=tensor(layer, f"{mixer}.out_proj.bias"))
    return w


def mamba2_state_canonical(r_row, s_row, lc: RecurrentConfig) -> dict:
    """build_mamba2_layer's states: the conv row ``[C, K-1]`` channel-major, the SSM row
    ``{d_state, head_dim, n_head}`` (ggml ssm_scan's ``ggml_reshape_4d(states, d_state,
    head_dim, n_head, ...)``), which read row-major is HF's ``[H, head_dim, N]`` as it
    stands (no transpose)."""
    out = {}
    if r_row.size:
        out["state_conv"] = r_row.reshape(lc.conv_channels, lc.conv_kernel - 1)
    if s_row.size:
        out["state_rec"] = s_row.reshape(lc.n_v_heads, lc.v_dim, lc.k_dim)
    return out


def mamba2_convert(name: str, data, s: Mamba2Sizes):
    """conversion/mamba.py ``Mamba2Model.filter_tensors`` (``dt_bias`` ->
    ``dt_proj.bias``) and ``modify_tensors``: the conv squeezed, A and D ``(H,)`` ->
    ``(H, 1)``, the gated norm ``(d_inner,)`` -> ``(n_groups, d_inner / n_groups)``
    (A_log's ``-exp`` is the value step, NegExpALog). ``[(name, data)]``, or None for
    a tensor that is not the mixer's."""
    if name.endswith(".dt_bias"):
        return [(name.rpartition(".dt_bias")[0] + ".dt_proj.bias", data)]
    if "conv1d.weight" in name:
        return [(name, data.squeeze())]
    if name.endswith((".A_log", ".D")):
        return [(name, data.reshape(*data.shape, 1))]
    if name.endswith((".mixer.norm.weight", ".mamba.norm.weight")):
        return [(name, data.reshape(s.groups, s.inner // s.groups))]
    return None


def refuse_short_conv(s: Mamba2Sizes, key: str) -> str | None:
    """llama.cpp's build_mamba2_layer: ``ssm_conv`` needs ``d_conv - 1 >= 1`` rows of state
    (mamba-base.cpp ``ggml_reshape_3d(conv, d_conv - 1, ...)`` of a zero-sized state)."""
    if s.conv < 2:
        return (f"{key}={s.conv}: llama.cpp's Mamba-2 keeps {key} - 1 rows of conv state and asserts at least one; "
                f"valid for --ref llamacpp: >= 2 (HF computes 1: --ref hf or hf_cached)")
    return None


def validate_ssd_shapes(ints: dict, heads: str, groups: str) -> None:
    """The SSD shapes HF checks late or not at all, by the config's own names (mamba2,
    nemotron_h, bamba / granitemoehybrid, falcon_h1): every size in ``ints`` a positive
    integer, the ``groups`` dividing the ``heads`` (head ``h`` reads B / C group
    ``h // (heads / groups)``)."""
    for key, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"{key}={v!r}: must be a positive integer")
    if ints[heads] % ints[groups]:
        raise UsageError(f"{groups}={ints[groups]} does not divide {heads}={ints[heads]}; valid: a divisor "
                         f"of {ints[heads]}")


class Mamba2Mixer:
    """The functions above as a family mix-in (before ``Family``): the family says
    where its mixer sits (``mamba2_module``) and what its HF config calls the sizes
    (``mamba2_sizes``)."""

    mamba2_module = "mixer"

    def mamba2_sizes(self, config) -> Mamba2Sizes:
        raise NotImplementedError

    def mamba2_config(self, config, input_norm) -> RecurrentConfig:
        return mamba2_config(self.mamba2_sizes(config), config.hidden_size, input_norm)

    def mamba2_weights(self, layer, config) -> dict:
        return mamba2_weights(layer, self.mamba2_module, None, self.mamba2_sizes(config))

    def mamba2_validate(self, ints: dict, heads: str, groups: str) -> None:
        validate_ssd_shapes(ints, heads, groups)

    def mamba2_refusal(self, config, key: str = "conv_kernel") -> str | None:
        return refuse_short_conv(self.mamba2_sizes(config), key)

    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        return mamba2_state_canonical(r_row, s_row, lc)

    def mamba2_convert(self, name: str, data, config):
        return mamba2_convert(name, data, self.mamba2_sizes(config))
