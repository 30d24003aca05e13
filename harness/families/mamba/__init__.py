"""mamba: a pure Mamba-1 stack (HF ``MambaForCausalLM``, modeling_mamba.py; llama.cpp
arch ``mamba``, src/models/mamba.cpp with mamba-base.cpp ``build_mamba_layer``;
converter conversion/mamba.py ``MambaModel``).

Every layer is ``MambaBlock``: ``norm`` (RMS) -> ``MambaMixer`` -> + residual (no FFN),
described as ``contract.recurrent.RecurrentConfig`` kind ``mamba1``: ``in_proj`` -> x | z
(``projected_states.chunk(2)``), a SiLU causal conv with bias over x, ``x_proj`` -> dt
(``time_step_rank``) | B | C (``state_size`` each), ``dt_proj`` (weight only: its bias
goes inside the softplus, ``mamba_selective_scan(delta_bias=...)``), the decay
``exp(dt * A)`` per (channel, state) with ``A = -exp(A_log)`` ``[d_inner, N]``, the D
skip, ``y * silu(z)``, ``out_proj``.

llama.cpp's build_mamba_layer names NOTHING inside the layer: only mamba.cpp's
``attn_norm`` and ``l_out`` (the residual: no FFN, so also ``resid_mid``); the conv
state ``[d_inner, K-1]`` and the SSM state ``{d_state, d_inner}`` (HF's ``[d_inner, N]``)
come from ``llama_state_seq_get_data``.

A finding (findings.toml): HF's ``mamba_selective_scan`` (modeling_mamba.py) takes no
initial state -- "Initial hidden state is not supported by the kernel path" -- so
HF's cached path restarts the SSM from zero in every multi-row call after the first:
``hf_cached`` disagrees with impl, llama.cpp and HF's own full forward there, and
agrees where every later call is one row (``mamba_selective_state_update`` carries
the state).

Tiny config: 2 layers, hidden 64, expand 2 (llama.cpp's mamba loads only expansion 2:
mamba.cpp ``load_arch_tensors`` "only an expansion factor of 2 is supported"), state
16, conv 4, ``time_step_rank`` 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.recurrent import RecurrentConfig
from contract.layers import NormSpec

from ...errors import UsageError
from ..base import LcPoint
from ..mamba2 import Mamba2
from ..base import tensor
from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of


@dataclass(frozen=True)
class Mamba1Sizes:
    """One Mamba-1 mixer's sizes and switches, whatever the HF config calls them
    (MambaConfig / FalconMambaConfig: intermediate_size, state_size, ...; JambaConfig:
    mamba_expand * hidden_size, mamba_d_state, ...)."""

    inner: int
    state: int
    dt_rank: int
    conv: int
    conv_bias: bool
    proj_bias: bool


def mamba1_config(s: Mamba1Sizes, hidden: int, input_norm: NormSpec, bc_norm: NormSpec | None) -> RecurrentConfig:
    """MambaMixer.__init__ (and its copies FalconMambaMixer, JambaMambaMixer): d_inner
    channels of width 1 over one B / C group of ``state``; ``x_proj`` -> dt_rank | N | N;
    ``bc_norm``: the dt / B / C RMS norms after x_proj (None: plain Mamba-1)."""
    return RecurrentConfig.of(
        "mamba1", hidden_size=hidden, n_v_heads=s.inner, k_dim=s.state, dt_rank=s.dt_rank, conv_kernel=s.conv,
        conv_bias=s.conv_bias, in_bias=s.proj_bias, out_bias=s.proj_bias, bc_norm=bc_norm, input_norm=input_norm)


# JambaMambaMixer's weighted dt / B / C norms (JambaRMSNorm: ``weight * x * rsqrt(...)``),
# mixer-relative HF name -> impl weight name
BC_NORM_WEIGHTS = {"dt_layernorm.weight": "dt_norm", "b_layernorm.weight": "b_norm", "c_layernorm.weight": "c_norm"}


def mamba1_weights(layer, mixer: str, norm: str, s: Mamba1Sizes, bc_weights: bool = False) -> dict:
    """The mixer's weights at ``layer.<mixer>`` with its input norm ``layer.<norm>``:
    ``in_proj`` split x | z (``projected_states.chunk(2, dim=1)``), the conv squeezed;
    ``bc_weights``: the dt / B / C norms' weights (Jamba's JambaRMSNorm). FalconMamba's
    norms hold a ``weight`` buffer too, never read (FalconMambaWeightlessRMSNorm: "Dummy
    weights that are not used", dt's even d_inner wide): not taken."""

    m = lambda n: tensor(layer, f"{mixer}.{n}")  # noqa: E731
    di = s.inner
    w_in = m("in_proj.weight")
    w = {"attn_norm": tensor(layer, f"{norm}.weight"), "w_in": w_in[:di], "w_z": w_in[di:],
         "conv": m("conv1d.weight")[:, 0], "w_x_proj": m("x_proj.weight"),
         "w_dt": m("dt_proj.weight"), "dt_bias": m("dt_proj.bias"),
         "A_log": m("A_log"), "D": m("D"), "wo": m("out_proj.weight")}
    if bc_weights:
        w.update({ours: m(hf_name) for hf_name, ours in BC_NORM_WEIGHTS.items()})
    if s.conv_bias:
        w["conv_b"] = m("conv1d.bias")
    if s.proj_bias:
        b = m("in_proj.bias")
        w.update(b_in=b[:di], b_z=b[di:], bo=m("out_proj.bias"))
    return w


def mamba1_state_canonical(r_row, s_row, lc) -> dict:
    """build_mamba_layer's states: conv ``[d_inner, K-1]`` channel-major (as
    mamba2's), SSM ``{d_state, head_dim = 1, n_head = d_inner}`` (its
    ``ggml_reshape_4d(states, d_state, head_dim, n_head, ...)``), row-major HF's
    ``[d_inner, N]``."""
    out = {}
    if r_row.size:
        out["state_conv"] = r_row.reshape(lc.conv_channels, lc.conv_kernel - 1)
    if s_row.size:
        out["state_rec"] = s_row.reshape(lc.n_v_heads, lc.k_dim)
    return out


class Mamba(Mamba2):
    name = "mamba"
    # not fuzzed (and so nothing it would draw counts as varied in `conformance coverage`):
    # `conformance fuzz --family mamba,falcon_mamba --seed 0` fails on what is not yet read --
    # falcon_mamba's default config at 1 token (`conformance run --family falcon_mamba --ref all
    # --tokens 1`: llama.cpp L0 resid_mid nmse 8.8e-9 > 1e-10, impl's rec_out 6e-13 over the
    # oracle rule's 4.7e-13), and mamba's eps finding (mlx-lm's fixed 1e-5) between mlx and
    # llama.cpp, a pair it does not name (1.1e-10 > 1e-10 at eps 1e-6)
    fuzz_space = None
    hf_model_type = "mamba"
    description = "pure Mamba-1: selective scan with a per-(channel, state) decay, x_proj -> dt / B / C, D skip"
    tiny = dict(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4,
        time_step_rank=8, use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5, use_mambapy=False,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "mamba"
    # HF MambaConfig has no attention heads: the width and depth are all the generic checks read
    size_keys = {"hidden": "hidden_size", "layers": "num_hidden_layers"}
    # z enters the scan (mamba_selective_scan's `z`): the taps read it there, no gated norm
    hf_rec_gate_norm = None
    # mamba.cpp graph(): attn_norm and l_out; build_mamba_layer names nothing
    lc_points = {"attn_in": LcPoint("attn_norm"), "resid_mid": LcPoint("l_out"), "layer_out": LcPoint("l_out")}
    lc_not_exposed = {p: "mamba-base.cpp build_mamba_layer names no tensor inside the layer (mamba.cpp names only "
                         "attn_norm and l_out); the conv and SSM states are read from llama_state_seq_get_data"
                      for p in ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay", "rec_out",
                                "attn_branch", "attn_out")}
    # falcon_mamba / the file's ssm.dt_b_c_rms: RMS norms on dt / B / C after x_proj
    _bc_norm = False

    def validate(self, kw: dict) -> None:
        """The sizes by their HF names (HFConfig.validate's head checks have no heads to read)."""
        g = {**self.tiny, **kw}
        for key in ("hidden_size", "num_hidden_layers", "state_size", "conv_kernel", "expand"):
            v = g.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"{key}={v!r}: must be a positive integer")
        r = g.get("time_step_rank")
        if r != "auto" and (not isinstance(r, int) or isinstance(r, bool) or r < 1):
            raise UsageError(f"time_step_rank={r!r}: must be a positive integer or \"auto\" (HF MambaConfig: "
                             f"ceil(hidden_size / 16))")

    def lc_refusal(self, config) -> str | None:
        """mamba.cpp load_arch_tensors: ``2 * n_embd != d_inner`` throws."""
        if config.intermediate_size != 2 * config.hidden_size:
            return (f"expand={config.expand}: llama.cpp's mamba loads only an expansion factor of 2 (mamba.cpp "
                    f"load_arch_tensors); valid for --ref llamacpp: 2 (HF computes any: --ref hf or hf_cached)")
        # build_mamba_layer keeps d_conv - 1 rows of conv state as build_mamba2_layer does
        if config.conv_kernel < 2:
            return (f"conv_kernel={config.conv_kernel}: llama.cpp's Mamba keeps conv_kernel - 1 rows of conv state "
                    f"and asserts at least one; valid for --ref llamacpp: >= 2 (HF computes 1: --ref hf or hf_cached)")
        return None

    def _bc_norm_spec(self, config) -> NormSpec | None:
        """The dt / B / C norms' spec (None: plain Mamba-1)."""
        return None

    def _mamba1_sizes(self, config) -> Mamba1Sizes:
        """MambaConfig's names for the mixer's sizes (MambaMixer.__init__)."""
        return Mamba1Sizes(inner=config.intermediate_size, state=config.state_size,
                           dt_rank=int(config.time_step_rank), conv=config.conv_kernel,
                           conv_bias=bool(config.use_conv_bias), proj_bias=bool(config.use_bias))

    def layer_config(self, config, i: int) -> RecurrentConfig:
        return mamba1_config(self._mamba1_sizes(config), config.hidden_size,
                             NormSpec("rms", float(config.layer_norm_epsilon)), self._bc_norm_spec(config))

    def layer_weights(self, model, config, i: int) -> dict:
        return mamba1_weights(self.decoder_layers(model)[i], "mixer", "norm", self._mamba1_sizes(config))

    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        return mamba1_state_canonical(r_row, s_row, lc)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/mamba.py ``MambaModel.set_gguf_parameters``: its ``add_context_length(2**20)``,
        feed-forward length and head count 0, ``add_ssm_dt_b_c_rms`` (true for model_type
        falcon_mamba), the vocabulary as set_vocab pads it (to a multiple of 8)."""
        if config.use_bias:
            raise ValueError(f"{self.name} export: use_bias=true is not exported (build_mamba_layer loads no "
                             f"ssm_in / ssm_out bias); valid: false")
        if not config.use_conv_bias:
            raise ValueError(f"{self.name} export: use_conv_bias=false is not exported (mamba.cpp load_arch_tensors "
                             f"requires ssm_conv1d.bias); valid: true")
        w.add_context_length(2 ** 20)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_block_count(config.num_hidden_layers)
        w.add_ssm_conv_kernel(config.conv_kernel)
        w.add_ssm_inner_size(config.intermediate_size)
        w.add_ssm_state_size(config.state_size)
        w.add_ssm_time_step_rank(int(config.time_step_rank))
        w.add_layer_norm_rms_eps(config.layer_norm_epsilon)
        w.add_ssm_dt_b_c_rms(self._bc_norm)
        w.add_vocab_size(config.vocab_size)

    def config_from_gguf(self, meta, shapes, tensors):
        """mamba.cpp load_arch_hparams: ``ssm.conv_kernel``, ``ssm.inner_size``,
        ``ssm.state_size``, ``ssm.time_step_rank``, ``ssm.dt_b_c_rms`` (optional, false),
        the RMS eps; expand = inner_size / embedding_length (HF MambaConfig's). A file
        whose ``ssm.dt_b_c_rms`` is not this family's is the other Mamba-1 family's."""

        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        vocab = vocab_of(meta, shapes)
        inner = int(meta.get("ssm.inner_size"))
        if inner % hp.n_embd:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of embedding_length {hp.n_embd} (HF's expand)")
        rms = bool(meta.get("ssm.dt_b_c_rms", False))
        if rms != self._bc_norm:
            meta.refuse("ssm.dt_b_c_rms", rms, f"family {self.name} has {'the' if self._bc_norm else 'no'} dt / B / C "
                                               f"RMS norms (valid: {str(self._bc_norm).lower()}; the other value is "
                                               f"family {'mamba' if self._bc_norm else 'falcon_mamba'}'s)")
        eps = meta.get_f32("attention.layer_norm_rms_epsilon")
        return {"vocab_size": vocab, "hidden_size": hp.n_embd, "num_hidden_layers": hp.n_layer,
                "expand": inner // hp.n_embd,
                "state_size": int(meta.get("ssm.state_size")), "conv_kernel": int(meta.get("ssm.conv_kernel")),
                "time_step_rank": int(meta.get("ssm.time_step_rank")), "use_bias": False, "use_conv_bias": True,
                "layer_norm_epsilon": eps, "use_mambapy": False,
                "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}

    def gguf_convert(self, name, data, config, variant=None):
        """MambaModel.modify_tensors: the conv squeezed (``A_log``'s ``-exp`` is the value
        step, NegExpALog); A ``[d_inner, N]`` and D ``[d_inner]`` keep their shapes."""
        yield name, (data.squeeze() if "conv1d.weight" in name else data)


FAMILY = Mamba()
