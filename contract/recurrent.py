"""The recurrent layer descriptions a candidate is handed: the layer kinds
hybrid models put in attention's place (the spec's ``AttnShape::{ShortConv,
Mamba2, Mamba1, Gdn, Lightning}`` and Kimi's delta attention), described by ONE
frozen, validated ``RecurrentConfig`` (``spec/attn_block.rs.txt``: ``attn_block``
sends these shapes to a recurrent block on "this row's cache").

Every kind with a recurrence is the same linear-attention recurrence per value
head ``h`` over a state ``S[h]`` of ``[Dk, Dv]``::

    S = exp(g) * S + k (x) u          (g: the log-decay, per head or per key channel)
    u = beta * (v - S_decayed^T k)    (update "delta": the delta rule)
    u = beta * v  |  v                (update "plain": an outer-product write)
    y = S^T q  (+ D * v_in: the skip)

and the kinds differ only in where q, k, v, g and beta come from (the
projections, ``kind``) and in the fields below:

=============== ======== ======== ========= ======== ===================== ======== ==========================
kind            q / k    v        g (decay) beta     update / skip         conv     output stage
=============== ======== ======== ========= ======== ===================== ======== ==========================
gated_delta_net conv q,k conv v   per head  sigmoid  delta                 silu     rms(y)*w * silu(z), per head
kimi_delta      conv q,k conv v   per key   sigmoid  delta                 silu     rms(y)*w * sigmoid(z), per head
mamba2          C, B     x * dt   per head  none     plain, D skip         silu     rms(y * silu(z)) * w, per group
mamba1          C, B     x * dt   per key   none     plain, D skip         silu     y * silu(z)
lightning       silu q,k silu v   slope     none     plain                 none     rms(y)*w * sigmoid(z), whole row
short_conv      (no recurrence: the conv of B*x is the state)      none     C * conv(B*x)
=============== ======== ======== ========= ======== ===================== ======== ==========================

This module is data and validation only, like ``contract.layers``: what a field
COMPUTES -- the q scale a ``q_scale=None`` layer uses, which key head a value
head reads under ``head_map``, lightning's slopes from a layer index -- is each
engine's own (impl: ``impl.recurrent_kinds``), so no oracle shares a
candidate's code. Each description names its ``kind`` (the layer-kind plug-in
``harness/kinds/recurrent`` is registered under every recurrent kind), its report
``label`` and ``expected_probes()``: the recurrent probes of ``contract.probes``
a layer of this description must emit, from its kind and fields, and the STATE
probes (``state_conv``, ``state_rec``) compared at call boundaries.

Weights travel beside the description in a plain dict (impl's names:
``impl.recurrent.RECURRENT_WEIGHTS``), per role, in HF ``nn.Linear`` layout
``[out, in]``; a family that fuses roles (qwen3_next's ``in_proj_qkvz``,
mamba's ``in_proj``) splits them on the way in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .errors import ConfigError
from .layers import NormSpec, divisors

RECURRENT_KINDS = ("gated_delta_net", "kimi_delta", "short_conv", "mamba2", "mamba1", "lightning")
SCANS = ("sequential", "chunked")

# The fields each kind takes by default (RecurrentConfig.of); anything passed overrides.
KIND_DEFAULTS = {
    # HF Qwen3NextGatedDeltaNet.forward / Qwen3_5GatedDeltaNet.forward; llama.cpp qwen3next.cpp,
    # qwen35.cpp build_layer_attn_linear + delta-net-base.cpp
    "gated_delta_net": dict(conv_activation="silu", beta="sigmoid", decay="per_head", decay_param="softplus_A",
                            update="delta", qk_norm="l2", out_norm_groups=None, gate_act="silu",
                            gate_order="norm_then_gate"),
    # HF KimiLinearDeltaAttention.forward; llama.cpp kimi-linear.cpp
    "kimi_delta": dict(conv_activation="silu", beta="sigmoid", decay="per_key", decay_param="softplus_A",
                       update="delta", qk_norm="l2", out_norm_groups=None, gate_act="sigmoid",
                       gate_order="norm_then_gate"),
    # HF Lfm2ShortConv.forward; llama.cpp lfm2.cpp build_shortconv_block
    "short_conv": dict(conv_activation="none", beta="none", decay="none", decay_param="none", update="none",
                       qk_norm="none", out_norm_groups=0, gate_act="identity", gate_order="gate_only"),
    # HF Mamba2Mixer.torch_forward; llama.cpp mamba-base.cpp build_mamba2_layer
    "mamba2": dict(conv_activation="silu", conv_bias=True, beta="none", decay="per_head", decay_param="dt_A",
                   update="plain", d_skip=True, qk_norm="none", gate_act="silu", gate_order="gate_then_norm"),
    # HF MambaMixer.slow_forward; llama.cpp mamba-base.cpp build_mamba_layer
    "mamba1": dict(conv_activation="silu", conv_bias=True, beta="none", decay="per_key", decay_param="dt_A",
                   update="plain", d_skip=True, qk_norm="none", out_norm_groups=0, gate_act="silu",
                   gate_order="gate_only", n_k_heads=1, v_dim=1),
    # HF MiniMaxLightningAttention.forward; llama.cpp minimax-01.cpp
    "lightning": dict(conv_kernel=0, conv_activation="silu", beta="none", decay="per_head", decay_param="slope",
                      update="plain", qk_norm="none", q_scale=1.0, out_norm_groups=1, gate_act="sigmoid",
                      gate_order="norm_then_gate"),
}

_CHOICES = {
    "conv_activation": ("silu", "none"),
    "head_map": ("grouped", "tiled"),
    "qk_norm": ("l2", "none"),
    "beta": ("sigmoid", "none"),
    "decay": ("per_head", "per_key", "none"),
    "decay_param": ("softplus_A", "dt_A", "slope", "none"),
    "update": ("delta", "plain", "none"),
    "gate_act": ("silu", "sigmoid", "identity"),
    "gate_order": ("norm_then_gate", "gate_then_norm", "gate_only"),
    "residual": ("input", "normed"),
    "scan": SCANS,
}


@dataclass(frozen=True)
class RecurrentConfig:
    """One recurrent layer, as data (see the module docstring's table).

    Heads and widths: ``n_k_heads`` (Hk: q/k heads -- GDN key heads, KDA and
    lightning heads, mamba2 B/C groups, mamba1 1), ``n_v_heads`` (Hv: heads of
    v and of the state -- GDN value heads, mamba2 heads, mamba1 ``d_inner``),
    ``k_dim`` (Dk; mamba: ``d_state``), ``v_dim`` (Dv; mamba2 ``head_dim``,
    mamba1 1). ``head_map``: which key head value head ``h`` reads when Hv >
    Hk -- ``grouped`` ``h // (Hv / Hk)`` (HF ``repeat_interleave`` in
    ``torch_chunk_gated_delta_rule``; llama.cpp qwen3next.cpp's
    "repeat interleave"; mamba2's B/C groups, ggml ssm_scan ``g = h / (nh /
    ng)``) or ``tiled`` ``h % Hk`` (llama.cpp qwen35.cpp, whose converter
    reorders the V heads grouped -> tiled, ``_LinearAttentionVReorderBase``;
    ggml ``gated_delta_net``: ``iq1 = iv1 % neq1``).

    Conv: ``conv_kernel`` K (0: no conv, lightning), ``conv_bias``,
    ``conv_activation`` (applied to the conv output, or to the projection where
    there is no conv: lightning's ``silu(qkv_proj(x))``). The conv state holds
    the last K - 1 rows that entered the conv.

    Gates: ``beta`` (sigmoid of a projection, or none); ``decay`` per head,
    per key channel or none; ``decay_param``: ``softplus_A`` ``g =
    -exp(A_log) * softplus(a + dt_bias)`` (GDN, KDA), ``dt_A`` ``dt =
    softplus(dt_raw + dt_bias)`` clamped to ``dt_limit``, ``g = -exp(A_log)
    * dt`` and the write scaled by ``dt`` (mamba), ``slope`` ``g = -slope_h``
    (lightning, ``decay_slopes``). ``decay_rank``: the decay input goes
    through a rank-r bottleneck (KDA ``f_b(f_a(x))``, r = head_dim).

    q/k: ``qk_norm`` ``l2`` with ``qk_norm_eps`` (``x / sqrt(sum x^2 + eps)``:
    HF fixes 1e-6 in ``l2norm``, llama.cpp ``build_gdn_l2_norm`` reads
    ``rms_norm_eps``; the family says which); ``q_scale`` (None: ``Dk ** -0.5``
    for the delta-rule kinds, as HF ``torch_*_gated_delta_rule`` and ggml
    ``gated_delta_net`` do, and 1 for the others). ``update``: ``delta`` or
    ``plain``; ``d_skip``: ``y += D * x`` (mamba).

    Output stage: ``out_norm_groups`` -- RMS norm of ``y`` over that many equal
    groups of the ``Hv * Dv`` row (``None``: one per head, GDN / KDA; 1: the
    whole row, lightning; G: mamba2's grouped norm; 0: no norm, mamba1 and
    short conv) with ``out_norm_eps``; ``gate_act`` of ``z`` (``silu``,
    ``sigmoid``, ``identity``: short conv's ``C *``), ``gate_order``
    (``norm_then_gate``: HF ``Qwen3NextRMSNormGated``, ``KimiLinearRMSNormGated``,
    ``FalconH1RMSNormGated(norm_before_gate=True)``; ``gate_then_norm``: HF
    ``MambaRMSNormGated``, and llama.cpp's mamba2 / falcon-h1 graph always;
    ``gate_only``: no norm). ``z_rank``: the gate's rank-r bottleneck (KDA
    ``g_b(g_a(x))``).

    mamba1: ``dt_rank`` (``x_proj`` -> dt, B, C; ``dt_proj``), ``bc_norm``
    (falcon_mamba / jamba: RMS of dt, B and C after ``x_proj``; weights
    ``dt_norm`` / ``b_norm`` / ``c_norm`` present: jamba's weighted norm, absent:
    falcon_mamba's weightless one).

    ``scan``: the recurrence's form -- ``sequential`` (one row after another,
    ggml's kernels, HF's decode path) or ``chunked`` (``chunk_size`` rows at a
    time in the WY / UT form, HF ``torch_chunk_gated_delta_rule`` and the SSD
    chunk scan): the same recurrence, different rounding. ``input_norm``: the
    layer's input norm; ``residual`` what the branch is added to.
    """

    kind: str
    hidden_size: int
    n_k_heads: int = 0
    n_v_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0
    conv_kernel: int = 4
    conv_bias: bool = False
    conv_activation: str = "silu"
    in_bias: bool = False  # the in-projections' biases (lfm2 conv_bias, mamba use_bias)
    out_bias: bool = False  # out_proj's bias
    head_map: str = "grouped"
    qk_norm: str = "none"
    qk_norm_eps: float = 1e-6
    q_scale: float | None = None
    beta: str = "none"
    decay: str = "none"
    decay_param: str = "none"
    decay_rank: int | None = None
    decay_slopes: tuple[float, ...] = ()
    dt_limit: tuple[float, float] | None = None
    dt_rank: int = 0
    bc_norm: NormSpec | None = None
    update: str = "none"
    d_skip: bool = False
    out_norm_groups: int | None = None
    out_norm_eps: float = 1e-6
    gate_act: str = "identity"
    gate_order: str = "gate_only"
    z_rank: int | None = None
    input_norm: NormSpec = field(default_factory=NormSpec)
    residual: str = "input"
    residual_alpha: float = 1.0
    residual_beta: float = 1.0
    # mamba2 only: HF FalconH1Mixer's ``mup_vector`` -- the in-projection's output scaled per
    # segment, (z, x, B, C, dt) (modeling_falcon_h1.py compute_mup_vector, ``ssm_multipliers``);
    # None: unscaled. llama.cpp folds it into ssm_in (conversion/falcon_h1.py modify_tensors).
    proj_multipliers: tuple[float, ...] | None = None
    scan: str = "sequential"
    chunk_size: int = 64

    @classmethod
    def of(cls, kind: str, **fields) -> "RecurrentConfig":
        """A config of ``kind`` with that kind's defaults (``KIND_DEFAULTS``), ``fields`` over them."""
        if kind not in KIND_DEFAULTS:
            raise ConfigError(f"unknown recurrent kind {kind!r}; valid: {', '.join(RECURRENT_KINDS)}")
        return cls(kind=kind, **{**KIND_DEFAULTS[kind], **fields})

    def __post_init__(self):
        if self.kind not in RECURRENT_KINDS:
            raise ConfigError(f"unknown recurrent kind {self.kind!r}; valid: {', '.join(RECURRENT_KINDS)}")
        if self.hidden_size < 1:
            raise ConfigError(f"hidden_size must be >= 1, got {self.hidden_size}")
        for name, valid in _CHOICES.items():
            if getattr(self, name) not in valid:
                raise ConfigError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
        for name in ("conv_bias", "in_bias", "out_bias", "d_skip"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.kind == "lightning":
            if self.conv_kernel != 0:
                raise ConfigError(f"conv_kernel={self.conv_kernel}: a lightning layer has no conv; valid: 0")
        elif self.conv_kernel < 1:
            raise ConfigError(f"conv_kernel={self.conv_kernel}: a {self.kind} layer's causal conv needs a kernel "
                              f"of at least 1 row; valid: >= 1")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.kind == "short_conv":
            if self.decay != "none" or self.update != "none" or self.beta != "none":
                raise ConfigError("a short_conv layer has no recurrence; valid: decay, update and beta 'none'")
            return
        self._check_heads()
        self._check_gates()
        self._check_output()

    def _check_heads(self):
        hk, hv, dk, dv = self.n_k_heads, self.n_v_heads, self.k_dim, self.v_dim
        if min(hk, hv, dk, dv) < 1:
            raise ConfigError(f"a {self.kind} layer needs n_k_heads, n_v_heads, k_dim, v_dim >= 1 "
                              f"(got {hk}, {hv}, {dk}, {dv})")
        if hv % hk:
            raise ConfigError(f"n_k_heads={hk} does not divide n_v_heads={hv}; valid: a divisor of {hv} "
                              f"({', '.join(map(str, divisors(hv)))})")
        if self.kind in ("kimi_delta", "lightning"):
            # HF KimiLinearDeltaAttention / MiniMaxLightningAttention: one head_dim, one head count
            if dk != dv:
                raise ConfigError(f"k_dim={dk} != v_dim={dv}: a {self.kind} head has one head_dim; valid: equal")
            if hk != hv:
                raise ConfigError(f"n_k_heads={hk} != n_v_heads={hv}: a {self.kind} layer has one head count; "
                                  f"valid: equal")
        if self.kind == "mamba1":
            if hk != 1 or dv != 1:
                raise ConfigError(f"a mamba1 layer is d_inner value heads of width 1 over one B/C group; valid: "
                                  f"n_k_heads=1, v_dim=1 (got {hk}, {dv})")
            if self.dt_rank < 1:
                raise ConfigError(f"a mamba1 layer needs dt_rank >= 1 (x_proj -> dt), got {self.dt_rank}")

    def _check_gates(self):
        want = {"gated_delta_net": ("per_head", "softplus_A", "delta"), "kimi_delta": ("per_key", "softplus_A", "delta"),
                "mamba2": ("per_head", "dt_A", "plain"), "mamba1": ("per_key", "dt_A", "plain"),
                "lightning": ("per_head", "slope", "plain")}[self.kind]
        got = (self.decay, self.decay_param, self.update)
        if got != want:
            # the kind's projections make exactly these inputs: another combination would
            # read a weight the kind does not have
            raise ConfigError(f"a {self.kind} layer's decay / decay_param / update are {'/'.join(want)}, "
                              f"got {'/'.join(got)}")
        if self.beta == "sigmoid" and self.kind not in ("gated_delta_net", "kimi_delta"):
            raise ConfigError(f"beta='sigmoid' needs a beta projection, which a {self.kind} layer has not; valid: none")
        if self.decay_param == "slope" and len(self.decay_slopes) != self.n_v_heads:
            raise ConfigError(f"decay_slopes has {len(self.decay_slopes)} entries for {self.n_v_heads} heads; "
                              f"valid: one slope per head (lightning_slopes computes them)")
        if self.decay_param == "slope" and not all(s >= 0 for s in self.decay_slopes):
            raise ConfigError(f"decay_slopes must be >= 0 (the decay is exp(-slope)), got {self.decay_slopes}")
        if self.dt_limit is not None:
            lo, hi = self.dt_limit
            if not lo <= hi:
                raise ConfigError(f"dt_limit {self.dt_limit}: the lower bound exceeds the upper; valid: (lo, hi), lo <= hi")
        for name in ("decay_rank", "z_rank"):
            r = getattr(self, name)
            if r is not None and (r < 1 or self.kind != "kimi_delta"):
                raise ConfigError(f"{name}={r}: a low-rank bottleneck is Kimi delta attention's (f_a/f_b, g_a/g_b), "
                                  f"of rank >= 1; valid for {self.kind}: None")
        if self.bc_norm is not None and self.kind != "mamba1":
            raise ConfigError(f"bc_norm (dt / B / C norms after x_proj) is mamba1's; valid for {self.kind}: None")

    def _check_output(self):
        width = self.n_v_heads * self.v_dim
        g = self.out_norm_groups
        if g is not None and (g < 0 or (g > 0 and width % g)):
            raise ConfigError(f"out_norm_groups={g} does not divide the output row of {width}; valid: None (per head), "
                              f"0 (no norm) or a divisor of {width}")
        pm = self.proj_multipliers
        if pm is not None and (self.kind != "mamba2" or len(pm) != 5 or not all(
                isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) for m in pm)):
            raise ConfigError(f"proj_multipliers={pm!r}: five finite numbers (z, x, B, C, dt) of a mamba2 layer's "
                              f"in-projection; valid: None or five numbers with kind mamba2")
        if (g == 0) != (self.gate_order == "gate_only"):
            raise ConfigError(f"gate_order={self.gate_order!r} with out_norm_groups={g}: 'gate_only' is the order of "
                              f"an output stage without a norm (out_norm_groups=0) and only of it")

    # --- derived -----------------------------------------------------------------

    @property
    def conv_channels(self) -> int:
        """C: the channels that enter the causal conv (0 for lightning)."""
        hk, hv, dk, dv = self.n_k_heads, self.n_v_heads, self.k_dim, self.v_dim
        return {"gated_delta_net": 2 * hk * dk + hv * dv, "kimi_delta": 3 * hk * dk, "short_conv": self.hidden_size,
                "mamba2": hv * dv + 2 * hk * dk, "mamba1": hv, "lightning": 0}[self.kind]

    @property
    def width(self) -> int:
        """The output row's width (what enters out_proj)."""
        return self.hidden_size if self.kind == "short_conv" else self.n_v_heads * self.v_dim

    @property
    def norm_groups(self) -> int:
        """How many RMS groups the output row has (0: no norm)."""
        return self.n_v_heads if self.out_norm_groups is None else self.out_norm_groups

    @property
    def has_recurrence(self) -> bool:
        return self.kind != "short_conv"

    @property
    def label(self) -> str:
        """The layer kind a report row carries: the recurrent kind itself."""
        return self.kind

    def expected_probes(self) -> tuple[str, ...]:
        """The probes this layer must emit after ``layer_in``, in dataflow order
        (``contract.probes``): the conv's input and output and its state where the
        kind has a conv, the gate's input, the recurrence's inputs, gates, output
        and state where it has one, then the branch, what is added to the residual
        and the residual."""
        conv = ("rec_conv_in", "rec_conv", "state_conv") if self.conv_kernel else ()
        rec = ()
        if self.has_recurrence:
            rec = ("rec_q", "rec_k", "rec_v") + (("rec_beta",) if self.beta != "none" else ()) + (
                "rec_decay", "rec_out", "state_rec")
        return ("attn_in",) + conv + ("rec_z",) + rec + ("attn_branch", "attn_out", "resid_mid")

    def replace(self, **kw) -> "RecurrentConfig":
        return replace(self, **kw)


