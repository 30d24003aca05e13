"""The Mamba-2 mixer as several families carry it (HF ``Mamba2Mixer``, modeling_mamba2.py;
``NemotronHMamba2Mixer``, modeling_nemotron_h.py; llama.cpp mamba-base.cpp
``build_mamba2_layer``; converter conversion/mamba.py ``Mamba2Model``): ONE mapping of
its sizes, weights, llama.cpp states and converter steps, which a family parameterises
with its HF config's names (``mamba2_sizes``). The pure stack (mamba2) and the hybrids
(nemotron_h) read the same mixer through it.

The mixer is ``contract.recurrent.RecurrentConfig`` kind ``mamba2``: ``in_proj`` -> z |
xBC | dt (``projected_states.split([intermediate, conv_dim, num_heads])``), a SiLU
causal conv over xBC, split x | B | C (v = x, k = B, q = C over ``n_groups`` groups),
``dt = softplus(dt + dt_bias)`` (clamped to the mixer's ``time_step_limit`` in HF's
chunked scan only), the per-head decay ``exp(dt * A)``, ``A = -exp(A_log)``, the D skip,
then the gated RMS norm over ``n_groups`` groups (``y * silu(z)`` first) and ``out_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.recurrent import RecurrentConfig
from impl import NormSpec

from ..errors import UsageError
from .base import tensor


@dataclass(frozen=True)
class Mamba2Sizes:
    """One Mamba-2 mixer's sizes and switches, whatever the HF config calls them."""

    heads: int
    head_dim: int
    groups: int
    state: int
    conv: int
    conv_bias: bool
    bias: bool  # in_proj / out_proj biases (HF use_bias / mamba_proj_bias)
    eps: float  # the gated norm's
    chunk: int
    dt_limit: tuple[float, float]

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.groups * self.state


class Mamba2Mixer:
    """The Mamba-2 half of a family (mixed in before ``Family``)."""

    # the mixer's path in the decoder layer (its weights' prefix)
    mamba2_module = "mixer"

    def mamba2_sizes(self, config) -> Mamba2Sizes:
        raise NotImplementedError

    def mamba2_config(self, config, input_norm: NormSpec) -> RecurrentConfig:
        """Mamba2Mixer.__init__ (and NemotronHMamba2Mixer's, the same body): heads of
        ``head_dim``, B / C over ``n_groups`` groups of ``state_size``; the gated norm
        (``MambaRMSNormGated`` / ``NemotronHRMSNormGated(intermediate, group_size=
        intermediate // n_groups)``): gate then norm over n_groups groups."""
        s = self.mamba2_sizes(config)
        return RecurrentConfig.of(
            "mamba2", hidden_size=config.hidden_size, n_k_heads=s.groups, n_v_heads=s.heads,
            k_dim=s.state, v_dim=s.head_dim, conv_kernel=s.conv, conv_bias=s.conv_bias, in_bias=s.bias,
            out_bias=s.bias, out_norm_groups=s.groups, out_norm_eps=s.eps,
            dt_limit=None if s.dt_limit == (0.0, float("inf")) else s.dt_limit, chunk_size=s.chunk,
            input_norm=input_norm)

    def mamba2_weights(self, layer, config) -> dict:
        """The mixer's weights per impl role (impl.recurrent.RECURRENT_WEIGHTS), in_proj
        split as ``projected_states.split([intermediate, conv_dim, num_heads])``."""
        s, m = self.mamba2_sizes(config), self.mamba2_module
        di, cd = s.d_inner, s.conv_dim
        w_in = tensor(layer, f"{m}.in_proj.weight")
        w = {"w_z": w_in[:di], "w_in": w_in[di:di + cd], "w_decay": w_in[di + cd:],
             "conv": tensor(layer, f"{m}.conv1d.weight")[:, 0], "dt_bias": tensor(layer, f"{m}.dt_bias"),
             "A_log": tensor(layer, f"{m}.A_log"), "D": tensor(layer, f"{m}.D"),
             "out_norm": tensor(layer, f"{m}.norm.weight"), "wo": tensor(layer, f"{m}.out_proj.weight")}
        if s.conv_bias:
            w["conv_b"] = tensor(layer, f"{m}.conv1d.bias")
        if s.bias:
            b = tensor(layer, f"{m}.in_proj.bias")
            w.update(b_z=b[:di], b_in=b[di:di + cd], b_decay=b[di + cd:], bo=tensor(layer, f"{m}.out_proj.bias"))
        return w

    def mamba2_validate(self, ints: dict, heads: str, groups: str) -> None:
        """The SSD shapes HF checks late or not at all, by the config's own names:
        every size in ``ints`` a positive integer, the ``groups`` dividing the ``heads``
        (head ``h`` reads B / C group ``h // (heads / groups)``)."""
        for key, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"{key}={v!r}: must be a positive integer")
        if ints[heads] % ints[groups]:
            raise UsageError(f"{groups}={ints[groups]} does not divide {heads}={ints[heads]}; valid: a divisor "
                             f"of {ints[heads]}")

    def mamba2_refusal(self, config, reference: str) -> str | None:
        """build_mamba2_layer: ``ssm_conv`` needs ``d_conv - 1 >= 1`` rows of state
        (mamba-base.cpp ``ggml_reshape_3d(conv, d_conv - 1, ...)`` of a zero-sized state)."""
        k = self.mamba2_sizes(config).conv
        if reference == "llamacpp" and k < 2:
            return (f"conv_kernel={k}: llama.cpp's Mamba-2 keeps conv_kernel - 1 rows of conv state and asserts "
                    f"at least one; valid for --ref llamacpp: >= 2 (HF computes 1: --ref hf or hf_cached)")
        return None

    # ------------------------------------------------------------------ llama.cpp
    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        """build_mamba2_layer's states: the conv row as the delta nets' ([C, K-1],
        channel-major), the SSM row ``{d_state, head_dim, n_head}`` (ggml ssm_scan's
        ``ggml_reshape_4d(states, d_state, head_dim, n_head, ...)``), which read
        row-major is HF's ``[H, head_dim, N]`` as it stands (no transpose)."""
        out = {}
        if r_row.size:
            out["state_conv"] = r_row.reshape(lc.conv_channels, lc.conv_kernel - 1)
        if s_row.size:
            out["state_rec"] = s_row.reshape(lc.n_v_heads, lc.v_dim, lc.k_dim)
        return out

    # ------------------------------------------------------------------ GGUF
    def mamba2_convert(self, name: str, data: np.ndarray, config):
        """Mamba2Model.filter_tensors (``dt_bias`` -> ``dt_proj.bias``) and modify_tensors:
        the conv squeezed, A and D ``(H,)`` -> ``(H, 1)``, the gated norm ``(d_inner,)`` ->
        ``(n_groups, d_inner / n_groups)``; A_log's ``-exp`` is the value step
        (NegExpALog). ``[(name, data)]``, or None where the tensor is not the mixer's."""
        m = f"{self.mamba2_module}."
        if name.endswith(f"{m}dt_bias"):
            return [(name.rpartition(".dt_bias")[0] + ".dt_proj.bias", data)]
        if name.endswith(f"{m}conv1d.weight"):
            return [(name, data.squeeze())]
        if name.endswith((f"{m}A_log", f"{m}D")):
            return [(name, data.reshape(*data.shape, 1))]
        if name.endswith(f"{m}norm.weight"):
            s = self.mamba2_sizes(config)
            return [(name, data.reshape(s.groups, s.d_inner // s.groups))]
        return None
