"""The layer descriptions a candidate is handed: what one layer computes, as data.

The specification (``spec/attn_block.rs.txt``) keeps every decoration of the
attention half of a decoder layer in ONE body and lets the data say which
decorations a layer has. These classes are that data, one per layer kind --
``LayerConfig`` (attention, and the spec's Linear / Absent shapes),
``MlaConfig`` (DeepSeek-style latent attention, ``spec/mla.rs.txt``) and
``Unimplemented`` (a layer of a kind nobody describes yet: the report lists it
by name) -- frozen and validated at construction, so an impossible shape is
refused before any arithmetic runs (the harness turns the refusal into a
one-line error).

Each description names its ``kind`` (the layer-kind plugin that owns its
probes, features and mutants: ``harness/kinds/<kind>``), the ``label`` a report
row carries, and ``expected_probes()``: the probes a layer of this description
must emit, from its kind and shape -- never from what a candidate chose to
record (harness/verdict.py). Arithmetic is not here: what ``scale=None`` or a
window computes is each engine's own (impl: ``impl.config``), so an oracle
never shares a candidate's code.

Weights are not here either; they travel beside the description in a plain
dict (impl's names: ``impl.attention.LAYER_WEIGHTS``, ``impl.mla.MLA_WEIGHTS``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from .errors import ConfigError

NormKind = Literal["rms", "rms1p", "layer", "l2", "none"]
RopeLayout = Literal["neox", "interleaved"]
AttnShape = Literal["gqa", "linear", "absent"]
WindowKind = Literal["sliding", "chunked"]


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
    # One divisor per rotated pair: pair i turns by ``pos * inv_freq[i] / freq_factors[i]``
    # (llama.cpp ``ggml_rope_ext``'s ``freq_factors``, the per-layer ``rope_long`` /
    # ``rope_short`` tensors ``llama_model::get_rope_factors`` picks). LongRoPE (phi3,
    # phimoe, minicpm3: HF ``_compute_longrope_parameters``, ``inv_freq = 1 /
    # (ext_factors * base ** (2i / d))``) is the theta bands divided by the short OR the
    # long factor set, with its ``attention_factor`` on cos and sin. None: no divisor.
    freq_factors: tuple[float, ...] | None = None

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    def __post_init__(self):
        if self.layout not in ("neox", "interleaved"):
            raise ConfigError(f"unknown RoPE layout {self.layout!r}; valid: neox, interleaved")
        if not self.inv_freq:
            raise ConfigError("RoPE with zero rotated channels; use rope=None for a NoPE layer")
        if self.freq_factors is not None:
            ff = self.freq_factors
            if len(ff) != len(self.inv_freq):
                raise ConfigError(f"RoPE freq_factors has {len(ff)} values for {len(self.inv_freq)} rotated pairs; "
                                  "valid: one divisor per pair")
            if not all(isinstance(f, (int, float)) and math.isfinite(f) and f > 0 for f in ff):
                raise ConfigError(f"RoPE freq_factors must be finite and > 0, got {list(ff)[:8]!r}")


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


@dataclass(frozen=True)
class QkNormSpec:
    """A norm on Q and K.

    ``over``: ``head`` normalises each head's ``head_dim`` channels with a
    ``[head_dim]`` weight (qwen3, HF ``q_norm``); ``row`` normalises the whole
    ``n_heads * head_dim`` row with a row-wide weight (olmo2). ``where``: before
    RoPE (qwen3, olmo2, gemma3) or after it (llama4's L2 norm; the spec's
    ``qk_norm_after_rope`` explains the second home).

    ``per_head``: (``over="head"`` only) each head has its OWN weight -- ``q_norm``
    ``[n_heads, head_dim]``, ``k_norm`` ``[n_kv_heads, head_dim]`` (HF
    ``StableLmLayerNormPerHead``, ``CohereLayerNorm((num_heads, head_dim))``;
    llama.cpp stablelm.cpp / command-r.cpp ``attn_q_norm {n_embd_head_k, n_head}``).
    A LayerNorm QK norm may carry a bias (``q_norm_b`` / ``k_norm_b``, the tensor
    decides: HF phi ``q_layernorm = nn.LayerNorm(head_dim)``), shaped as its weight.
    """

    norm: NormSpec
    over: Literal["head", "row"] = "head"
    where: Literal["pre_rope", "post_rope"] = "pre_rope"
    per_head: bool = False

    def __post_init__(self):
        if self.over not in ("head", "row"):
            raise ConfigError(f"unknown QK norm span {self.over!r}; valid: head, row")
        if self.where not in ("pre_rope", "post_rope"):
            raise ConfigError(f"unknown QK norm place {self.where!r}; valid: pre_rope, post_rope")
        if not isinstance(self.per_head, bool):
            raise ConfigError(f"QK norm per_head must be true or false, got {self.per_head!r}")
        if self.per_head and self.over != "head":
            raise ConfigError("a QK norm with one weight per head normalises each head (over='head'); "
                              f"got over={self.over!r}")


@dataclass(frozen=True)
class TemperatureSpec:
    """Attention temperature tuning, per query position:
    ``q *= log1p(floor((pos + offset) / floor_scale)) * attn_scale + 1`` (llama.cpp
    ``llm_graph_input_attn_temp::set_input``, ``f_attn_temp_offset``). ``offset`` 1:
    llama4 (HF ``Llama4TextAttention.forward``: ``floor((cache_position + 1) /
    floor_scale)``; llama4.cpp ``f_attn_temp_offset = 1``); 0: ministral3 (HF
    ``get_llama_4_attn_scale``: ``floor(position_ids / original_max_position_embeddings)``;
    mistral3.cpp ``f_attn_temp_offset = 0``)."""

    floor_scale: float
    attn_scale: float
    offset: int = 1

    def __post_init__(self):
        if not (isinstance(self.floor_scale, (int, float)) and self.floor_scale > 0):
            raise ConfigError(f"temperature floor_scale must be > 0, got {self.floor_scale!r}")
        if self.offset not in (0, 1) or isinstance(self.offset, bool):
            raise ConfigError(f"temperature offset must be 0 (ministral3) or 1 (llama4), got {self.offset!r}")


@dataclass(frozen=True)
class LayerConfig:
    """The attention half of one decoder layer. ``scale`` None: the softmax scale is
    ``head_dim ** -0.5``."""

    kind: ClassVar[str] = "attention"

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
    # The output gate's squashing function: ``sigmoid`` (afmoe) or ``softplus`` (HF
    # ``LagunaAttention.forward``: ``F.softplus(g_proj(x).float())``; laguna.cpp), and its
    # width: one value per channel (``wg`` [n_heads * v_head_dim, hidden]) or ONE scalar
    # per head (``output_gate_per_head``: ``wg`` [n_heads, hidden], HF laguna
    # ``gating="per-head"``: ``attn.view(..., heads, head_dim) * gate.unsqueeze(-1)``).
    output_gate_fn: Literal["sigmoid", "softplus"] = "sigmoid"
    output_gate_per_head: bool = False
    # Where the QKV clamp acts: right after the biases (``bias``: olmo / dbrx / mpt, the
    # spec's apply_qkv_bias_and_clamp, llama.cpp build_qkv ``f_clamp_kqv``) or AFTER the
    # pre-RoPE QK norm (``qk_norm``: HF ``OlmoeAttention.forward`` norms q / k, THEN
    # ``clamp_(-clip_qkv, clip_qkv)`` on q, k and v).
    qkv_clamp_at: Literal["bias", "qk_norm"] = "bias"
    # gemma3n: V normalised per head before the cache (HF ``Gemma3nTextAttention.v_norm``,
    # an RMS norm without a weight; gemma3n.cpp ``ggml_rms_norm(Vcur)``), None: none.
    v_norm: NormSpec | None = None
    # KV shared across layers (gemma3n's last layers): the index of the EARLIER layer whose
    # cached K / V (after its K norm, V norm and RoPE) this layer attends over, instead of
    # projecting its own -- it has no wk / wv / k_norm and pushes nothing (HF
    # ``Gemma3nTextAttention.forward``: ``is_kv_shared_layer`` -> ``shared_kv_states[layer_type]``,
    # stored by the last earlier layer of its type; llama.cpp gemma3n.cpp ``hparams.has_kv(il)``
    # false -> ``build_attn(.., Qcur, nullptr, nullptr, ..)`` on the cache layer
    # llama-model.cpp's ``reuse`` callback names). None: the layer's own K / V.
    kv_source: int | None = None
    sub_norm: NormSpec | None = None  # bitnet: RMS over the concatenated heads before wo
    o_scale: float | None = None  # `wo_s`, the {1} companion of wo
    value_scale: float | None = None  # mimo-v2-flash: branch scaled after wo
    post_norm: NormSpec | None = None  # gemma2/olmo2: norm of the branch before the residual
    residual: Literal["sequential", "parallel"] = "sequential"
    residual_multiplier: float = 1.0  # granite: resid + branch * m
    # What the branch is added to: the layer's input (``input``, every pre-norm family) or
    # its NORMED input times ``residual_alpha`` (``normed``: HF ``MiniMaxDecoderLayer.forward``
    # ``residual = input_layernorm(x)``, ``residual * attn_alpha_factor + attn * attn_beta_factor``,
    # the beta being ``residual_multiplier``; llama.cpp minimax-01.cpp ``residual = cur`` after
    # ``attn_norm``, ``ggml_scale(residual, f_residual_scale)``). RecurrentConfig's ``residual``
    # / ``residual_alpha`` say the same of a recurrent layer.
    residual_base: Literal["input", "normed"] = "input"
    residual_alpha: float = 1.0
    # The spec's ``parallel_ssm_rows`` (falcon-h1.cpp:156-160; HF ``FalconH1DecoderLayer.forward``):
    # a Mamba-2 block (a ``contract.recurrent.RecurrentConfig`` of kind ``mamba2``) on the SAME
    # normed row as the attention, its output summed with the attention's into the residual
    # (None: no parallel branch). Its weights ride in the layer's dict under ``ssm.<name>``.
    parallel_ssm: Any = None
    # falcon_h1's branch multipliers (HF FalconH1DecoderLayer / FalconH1Attention): the row the
    # attention reads is ``normed * attn_in_multiplier``, K is ``k_proj(.) * key_multiplier``
    # (before RoPE), the attention's output (after wo) ``* attn_out_multiplier``; the SSM block
    # reads ``normed * ssm_in_multiplier`` and its output is ``* ssm_out_multiplier``. llama.cpp
    # folds every one into the weights (conversion/falcon_h1.py modify_tensors).
    attn_in_multiplier: float = 1.0
    key_multiplier: float = 1.0
    attn_out_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0

    def __post_init__(self):
        if self.hidden_size < 1:
            raise ConfigError(f"hidden_size must be >= 1, got {self.hidden_size}")
        if self.shape not in ("gqa", "linear", "absent"):
            raise ConfigError(f"unknown attention shape {self.shape!r}; valid: gqa, linear, absent")
        if self.shape != "gqa":
            if self.kv_source is not None:
                raise ConfigError(f"kv_source names the layer whose K/V an attention layer reads; a {self.shape} "
                                  "layer reads none; valid: kv_source=None")
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
        for name in ("q_gate_interleaved", "output_gate", "output_gate_per_head"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.output_gate_fn not in ("sigmoid", "softplus"):
            raise ConfigError(f"unknown output gate function {self.output_gate_fn!r}; valid: sigmoid, softplus")
        if (self.output_gate_per_head or self.output_gate_fn != "sigmoid") and not self.output_gate:
            raise ConfigError("output_gate_fn / output_gate_per_head describe the output gate; valid: with "
                              "output_gate=true")
        if self.qkv_clamp_at not in ("bias", "qk_norm"):
            raise ConfigError(f"unknown QKV clamp place {self.qkv_clamp_at!r}; valid: bias, qk_norm")
        if self.qkv_clamp_at == "qk_norm" and (
                self.qkv_clamp is None or self.qk_norm is None or self.qk_norm.where != "pre_rope"):
            raise ConfigError("qkv_clamp_at='qk_norm' clamps after the pre-RoPE QK norm; valid: with qkv_clamp set "
                              "and a pre_rope qk_norm (else qkv_clamp_at='bias')")
        if self.kv_source is not None:
            if isinstance(self.kv_source, bool) or not isinstance(self.kv_source, int) or self.kv_source < 0:
                raise ConfigError(f"kv_source={self.kv_source!r}: the index of the earlier layer whose K/V this "
                                  "layer reads; valid: an integer >= 0, or None (its own K/V)")
            if self.parallel_ssm is not None:
                raise ConfigError("a layer reading another layer's K/V (kv_source) with a parallel SSM branch: "
                                  "no family has both; valid: kv_source=None with parallel_ssm")
        if self.v_norm is not None and self.v_norm.kind not in ("l2", "rms"):
            raise ConfigError(f"v_norm kind {self.v_norm.kind!r}; valid: l2 (no weight), rms")
        if self.q_gate_interleaved and self.dv != self.head_dim:
            # spec split_interleaved_q_gate(q, rows, n_heads, head_dim) makes the gate
            # head_dim wide per head; apply_interleaved_gate multiplies it element by
            # element onto the V-width head output (qwen35.cpp: ggml_mul of the
            # [head_dim * n_head] gate and the [v_head_dim * n_head] kqv_out)
            raise ConfigError(f"the interleaved Q gate is head_dim={self.head_dim} wide per head and multiplies the "
                              f"attention output of width v_head_dim={self.dv}; valid: v_head_dim equal to head_dim")
        if self.residual not in ("sequential", "parallel"):
            raise ConfigError(f"unknown residual layout {self.residual!r}; valid: sequential, parallel")
        if self.residual_base not in ("input", "normed"):
            raise ConfigError(f"unknown residual base {self.residual_base!r}; valid: input, normed")
        if (self.residual_base == "normed" or self.residual_alpha != 1.0) and self.residual != "sequential":
            raise ConfigError("residual_base / residual_alpha describe the residual a sequential layer adds its "
                              "branch to; valid with residual='parallel': residual_base='input', residual_alpha=1")
        for name in ("attn_in_multiplier", "key_multiplier", "attn_out_multiplier", "ssm_in_multiplier",
                     "ssm_out_multiplier"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{name}={v!r}: must be a finite number")
        ssm = self.parallel_ssm
        if ssm is None:
            if self.ssm_in_multiplier != 1.0 or self.ssm_out_multiplier != 1.0:
                raise ConfigError("ssm_in_multiplier / ssm_out_multiplier scale the parallel SSM branch; valid: 1 "
                                  "without parallel_ssm")
        else:
            if getattr(ssm, "kind", None) != "mamba2":
                raise ConfigError(f"parallel_ssm is a Mamba-2 block (falcon-h1.cpp build_mamba2_layer); got kind "
                                  f"{getattr(ssm, 'kind', None)!r}; valid: a RecurrentConfig of kind mamba2")
            if ssm.hidden_size != self.hidden_size:
                raise ConfigError(f"parallel_ssm hidden_size {ssm.hidden_size} != the layer's {self.hidden_size}; "
                                  f"valid: the same row width")
            if self.residual != "sequential":
                raise ConfigError("parallel_ssm sums into a sequential residual (falcon-h1.cpp: attn_out + ssm_out "
                                  "+ inpSA); valid: residual='sequential'")

    @property
    def dv(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def label(self) -> str:
        """The layer kind a report row carries: ``attention``, or the spec's shape
        (``linear``, ``absent``)."""
        return "attention" if self.shape == "gqa" else self.shape

    def expected_probes(self) -> tuple[str, ...]:
        """The probes this layer must emit after ``layer_in``, in dataflow order."""
        seq = ("resid_mid",) if self.residual == "sequential" else ()
        if self.shape == "absent":
            return ("resid_mid",)
        if self.shape == "linear":
            return ("attn_in", "attn_out") + seq
        ssm = ("ssm_out",) if self.parallel_ssm is not None else ()
        if self.kv_source is not None:
            # a layer reading another layer's K/V projects only Q: its k / v / k_rope are the
            # source layer's (HF has no k_proj there; gemma3n.cpp names only Qcur*)
            return ("attn_in", "q", "q_rope", "attn_probs", "attn_heads", "attn_branch", "attn_out") + seq
        return ("attn_in", "q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads", "attn_branch",
                "attn_out") + ssm + seq

    def replace(self, **kw) -> "LayerConfig":
        return replace(self, **kw)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


MlaForm = Literal["naive", "absorbed"]
MLA_FORMS = ("naive", "absorbed")


@dataclass(frozen=True)
class MlaYarn:
    """The file's YaRN (spec ``crate::mla_yarn::MlaYarn``): ONE setting that the
    rotation and the softmax scale both read, so no caller can give one half and
    forget the other. ``freq_factors``: the divisor of each rotated band
    (plain ``inv_freq / freq_factors`` = YaRN's per-band frequencies);
    ``pe_magnitude``: the magnitude on the rotated channels after the rotation
    (ggml ``rope_yarn``'s mscale; HF ``attention_factor`` on cos and sin);
    ``mscale``: whose square is folded into the softmax scale (spec
    ``kq_scale(yarn, q_head_dim)``; HF ``yarn_apply_mscale``:
    ``yarn_get_mscale(factor, mscale_all_dim)``)."""

    freq_factors: tuple[float, ...]
    pe_magnitude: float = 1.0
    mscale: float = 1.0

    def __post_init__(self):
        if not self.freq_factors or not all(f > 0 for f in self.freq_factors):
            raise ConfigError(f"MLA YaRN freq_factors must be positive, one per rotated pair, got {self.freq_factors!r}")
        if not self.pe_magnitude > 0 or not self.mscale > 0:
            raise ConfigError(f"MLA YaRN pe_magnitude and mscale must be > 0, got {self.pe_magnitude}, {self.mscale}")


@dataclass(frozen=True)
class MlaConfig:
    """One MLA layer, as data. The softmax scale of both forms is
    ``mscale^2 / sqrt(qk_nope + qk_rope)`` (spec ``kq_scale``; ``mscale`` from ``yarn``).

    ``rope``: RoPE of the decoupled ``qk_rope`` slices at their plain bands
    (``None``: no rotation at all, Kimi's NoPE MLA), interleaved only (the
    spec's ``apply_rope_interleaved``). ``yarn``: the file's YaRN (``MlaYarn``),
    the ONE setting the rotation (per-band divisors, magnitude on the rotated
    channels) and the softmax scale (its mscale squared) both take -- the
    spec's ``yarn`` argument of ``mla_forward_token``; ``None`` is a plain file.
    ``q_a_norm`` / ``kv_a_norm``: the latent RMS norms (HF hard-codes eps 1e-6
    there, llama.cpp uses ``rms_norm_eps``; the family says which).
    """

    kind: ClassVar[str] = "mla"

    hidden_size: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    input_norm: NormSpec = field(default_factory=NormSpec)
    q_a_norm: NormSpec = field(default_factory=NormSpec)
    kv_a_norm: NormSpec = field(default_factory=NormSpec)
    rope: RopeSpec | None = None
    yarn: MlaYarn | None = None
    # the query's per-position temperature (mistral4: HF Mistral4Attention.forward's
    # get_llama_4_attn_scale on the whole query; llama.cpp deepseek2.cpp's
    # Qcur_attn_temp_scaled when the file names a temperature scale); None: off
    temperature: TemperatureSpec | None = None
    form: MlaForm = "absorbed"
    use_output_gate: bool = False
    residual: Literal["sequential", "parallel"] = "sequential"
    # the branch's weight in the residual: resid_mid = layer_in + attn_out * m (MiniCPM3's
    # muP scale_depth / sqrt(num_hidden_layers): MiniCPM3DecoderLayer.forward, llama.cpp
    # minicpm3.cpp `scale_res`); 1 elsewhere
    residual_multiplier: float = 1.0

    def __post_init__(self):
        for name in ("hidden_size", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"MLA {name} must be a positive integer, got {v!r}")
        if not isinstance(self.qk_rope_head_dim, int) or self.qk_rope_head_dim < 0:
            raise ConfigError(f"MLA qk_rope_head_dim must be >= 0, got {self.qk_rope_head_dim!r}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank < 1):
            raise ConfigError(f"MLA q_lora_rank must be a positive integer or None (direct q), got {self.q_lora_rank!r}")
        if self.form not in MLA_FORMS:
            raise ConfigError(f"unknown MLA form {self.form!r}; valid: {', '.join(MLA_FORMS)}")
        if self.residual not in ("sequential", "parallel"):
            raise ConfigError(f"unknown residual layout {self.residual!r}; valid: sequential, parallel")
        if self.rope is not None:
            if self.rope.rotary_dim != self.qk_rope_head_dim:
                raise ConfigError(f"MLA RoPE rotates {self.rope.rotary_dim} channels; the decoupled slice is "
                                  f"qk_rope_head_dim={self.qk_rope_head_dim} (they must be equal)")
            if self.rope.layout not in ("interleaved", "neox"):
                # spec rotate_pe: apply_rope_interleaved, the NORM layout (deepseek2.cpp); MiniCPM3
                # rotates its slices rotate-half (HF MiniCPM3Attention apply_rotary_pos_emb;
                # llama.cpp minicpm3 is LLAMA_ROPE_TYPE_NEOX)
                raise ConfigError(f"MLA rotates its decoupled slices in interleaved pairs or rotate-half; "
                                  f"got RoPE layout {self.rope.layout!r}; valid: interleaved, neox")
            if self.rope.kind not in ("default", "linear", "longrope") or (
                    self.rope.kind != "longrope" and self.rope.attention_factor != 1.0):
                # linear: bands divided by one factor, no magnitude (llama.cpp freq_scale; the
                # identity rotation feature bisection switches RoPE off with); longrope: bands
                # divided by the factor set, its attention factor on cos and sin (MiniCPM3:
                # HF _compute_longrope_parameters, llama.cpp ggml_rope_ext freq_factors)
                raise ConfigError(f"MLA RoPE is the rotation at theta's bands (valid scaling: default, linear, "
                                  f"longrope); {self.rope.kind!r} with attention factor "
                                  f"{self.rope.attention_factor} is not: YaRN is MlaConfig.yarn, which reaches "
                                  "the rotation and the softmax scale together")
        if self.yarn is not None:
            if self.rope is None:
                raise ConfigError("MLA YaRN without RoPE: the yarn setting scales the rotation's bands; "
                                  "valid: yarn with rope, or neither")
            if len(self.yarn.freq_factors) != len(self.rope.inv_freq):
                raise ConfigError(f"MLA YaRN has {len(self.yarn.freq_factors)} band factors for "
                                  f"{len(self.rope.inv_freq)} rotated pairs (they must be equal)")

    @property
    def label(self) -> str:
        """The layer kind reports carry: the form is part of it (``mla_absorbed`` /
        ``mla_naive``), so every row says which MLA form computed it."""
        return f"mla_{self.form}"

    def expected_probes(self) -> tuple[str, ...]:
        """The probes this layer must emit after ``layer_in``, in dataflow order."""
        out = ("attn_in",) + (("q_latent",) if self.q_lora_rank is not None else ()) + ("q", "kv_latent")
        out += ("q_pe", "k_pe") if self.qk_rope_head_dim else ()
        out += ("q_rope",) + (("k_rope",) if self.form == "naive" else ("q_absorbed",))
        seq = ("resid_mid",) if self.residual == "sequential" else ()
        return out + ("attn_probs", "attn_heads", "attn_branch", "attn_out") + seq

    @property
    def qk_head_dim(self) -> int:
        """The unabsorbed Q/K head width, ``nope + rope``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """One latent cache row, ``kv_lora_rank + rope``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def replace(self, **kw) -> "MlaConfig":
        return replace(self, **kw)


@dataclass(frozen=True)
class Unimplemented:
    """A layer of a kind no description covers yet (the report lists it by
    ``kind`` and ``reason``; the references are still compared with each other)."""

    kind: str
    reason: str

    @property
    def label(self) -> str:
        return self.kind

    def expected_probes(self) -> tuple[str, ...]:
        return ()


def guard_probe(desc) -> str | None:
    """The probe whose passing comparison guards a layer: its last attention probe
    (an absent layer's residual; None for an unimplemented one)."""
    probes = desc.expected_probes()
    if not probes:
        return None
    attn = [p for p in probes if p != "resid_mid"]
    return attn[-1] if attn else "resid_mid"
