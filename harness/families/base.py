"""What a model family knows: its tiny HF config, its seeded weights, how its
weights and hyper-parameters map into impl, and where its probes live in HF.

A family is data plus a few small methods; ``LlamaLike`` covers the shape most
decoder-only families share (``model.layers[i].self_attn.{q,k,v,o}_proj``,
``input_layernorm``, ``post_attention_layernorm``) so a family module states
only what differs, with a comment citing the HF module it mirrors.

``Family`` is assembled from one mixin per concern, each in its own module:

  _hf_config.py    HF config mapping (--set keys, the tiny config, shape checks)
  _hf_capture.py   where probes live in HF (points, eager function, layouts)
  _lc_capture.py   where probes live in llama.cpp's graph
  _gguf_export.py  the GGUF export hooks (the converter's steps)
  _gguf_import.py  the GGUF reverse import (--gguf)
  _switches.py     feature bisection's switches

this module keeps what a family IS (its model, its impl layers) and re-exports
the names other modules import from it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from dataclasses import dataclass, field
from typing import Any
import importlib
import inspect

import numpy as np

from contract.layers import Unimplemented, LayerConfig, NormSpec, QkNormSpec, WindowSpec
from impl import make_rope

from ._gguf_export import (YARN_KEYS, GGUFExport, gguf_moe_convert, gguf_size_params,  # noqa: F401 (re-exported)
                           gguf_yarn_params, text_model_gguf_params)
from ._gguf_import import GGUFImport
from ._hf_capture import HFCapture, Point
from ._hf_config import HFConfig, _divisors, _one_line  # noqa: F401 (re-exported)
from ._lc_capture import FUSED_QKV_NOPE_LC_POINTS, LcCapture, LcPoint, lc_unrotated  # noqa: F401 (re-exported)
from ._switches import ModelSwitch, Switches, rope_identity_overrides  # noqa: F401 (re-exported)
from .hookspec import check as _check_hooks
from harness.lazy import lazy
from ..errors import UsageError, suggest

torch = lazy("torch")
transformers = lazy("transformers")


# A layer no description covers (a linear-attention / delta-net layer): the report
# lists it by name, and the references are still compared with each other. The
# contract's class; a family writes ``NotInImpl(kind, reason)``.
NotInImpl = Unimplemented


INIT_FLOAT64_MAX = 1 << 24  # parameters; above it, seeded weights are drawn in float32 (Family.init_weights)
# the seeded weights a case's model is built with (Family.build_model; Case.weights)
WEIGHT_KINDS = ("random", "realistic", "trained")
# what ``trained`` draws for a recurrent layer's decay (Family.trained_apply): the
# references' own initialisers of the time step and A -- HF Mamba2Mixer / MambaMixer
# (time_step_min 1e-3, time_step_max 1e-1) and KimiLinearPreTrainedModel._init_weights
# (dt log-uniform in [1e-3, 1e-1], A uniform in [1, 16]), the ranges mamba_ssm's
# A_init_range and FLA's GatedDeltaNet use
TRAINED_DT = (1e-3, 1e-1)
TRAINED_A = (1.0, 16.0)
# the mean of a realistic outlier channel over its spread (Family.realistic_weights)
COHERENT = 2.0


class Family(HFConfig, HFCapture, LcCapture, GGUFExport, GGUFImport, Switches):
    name: str = ""
    hf_model_type: str = ""
    description: str = ""
    # Per-family sizes, passed as kwargs at construction so derived fields
    # (layer_types, head_dim, ...) come out right.
    tiny: dict = {}
    declared_features: tuple[str, ...] = ()
    # Named variants of the family's impl mapping and GGUF export (MLA: the naive
    # and absorbed forms); the first is the default.
    variants: tuple[str, ...] = ()
    # The fuzzer's space of the family (harness/fuzz.py): the knobs it may turn -- each
    # offered only where the family's llama.cpp graph reads the GGUF key it becomes --
    # and those only HF expresses (``hf_only``: judged against HF alone); None: the
    # family is not fuzzed.
    fuzz_space: dict | None = None
    # HF's experts kernel, passed to from_config where set (None: HF's default).
    # "eager": the experts' own forward loop from the modeling file; the default
    # grouped_mm kernel refuses float64 (HF at --dtype float64).
    experts_implementation: str | None = None
    # HF's cached path may run layer by layer, every call through a decoder layer before
    # the next layer (harness/references/hf/layer_major.py): declared where each decoder
    # layer reads and writes only its own cache layer; tests/test_layer_major.py holds
    # every family that declares it to the call-by-call capture, bit for bit.
    layer_major: bool = False

    def __init_subclass__(cls, **kw):
        # a family class defines declared hooks only (hookspec.py): a misspelt one is refused
        # here, where it would otherwise be silently ignored
        super().__init_subclass__(**kw)
        _check_hooks(cls)

    # ------------------------------------------------------------------ model
    def build_model(self, config, seed: int, dtype: str = "float32", weights: str = "random"):
        """The HF model of ``config`` with seeded weights: ``random`` (O(1) activations,
        ``init_weights``), ``realistic`` (the same, then a trained model's statistics:
        ``realistic_weights``) or ``trained`` (realistic, and the recurrent layers' decays
        as trained checkpoints spread them: ``trained_apply``)."""

        if weights not in WEIGHT_KINDS:

            raise UsageError(f"unknown weights {weights!r}; {suggest(weights, WEIGHT_KINDS)}")
        torch.manual_seed(seed)
        kw = {} if self.experts_implementation is None else {"experts_implementation": self.experts_implementation}
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32, **kw)
        self.init_weights(model, seed)
        if weights in ("realistic", "trained"):
            self.realistic_weights(model, config, seed, weights)
        return model.to(dtype=getattr(torch, dtype)).eval()

    # The names (endings) of the projections whose product is the attention score: scaled
    # by ``realistic_weights`` so the pre-softmax scores span tens, as a trained model's do.
    qk_weight_names: tuple[str, ...] = ("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_b_proj.weight")
    # ... and of the QK norms' weights, which a QK-norm family's scores scale with instead
    qk_norm_names: tuple[str, ...] = ("q_norm.weight", "k_norm.weight", "q_layernorm.weight", "k_layernorm.weight")

    def realistic_weights(self, model, config, seed: int, weights: str = "realistic") -> None:
        """A trained model's statistics on top of the random weights, where random
        N(0, 1/in) weights have none (issue 27 / 28: bounds fitted on those raised
        false alarms on real checkpoints, and low-precision bugs hid behind O(1)
        scores):

        - **outlier channels**: a few hidden channels (``max(2, hidden // 64)``, seeded)
          carry most of the residual stream's magnitude in trained models ("massive
          activations", Sun et al. 2024; LLM.int8()'s outlier features, Dettmers et
          al. 2022): the embeddings' columns at those channels are scaled 20-100x and
          every hidden-sized norm weight 1-3x there -- so the normed input that every
          projection reads, and the K-quant blocks that hold it, carry them too;
        - **coherent outliers**: those channels keep their sign from token to token
          (the same dimensions, the same sign, in almost every token: Dettmers et al.
          2022; Bondarenko et al. 2021), so each embedding column there also carries
          a mean of ``COHERENT`` (2) times its spread, of a seeded sign. Values then
          share a large common part across keys, as a trained model's do, and a
          key-by-key bfloat16 sum of ``attn @ V`` loses what it loses on a real
          checkpoint (issue 28: 8.2x HF's own error at L1 attn_heads, llama, 256
          tokens, where sign-free outliers gave 1.5x and O(1) random weights 2.9x);
          the scores still span tens (std 4.8, max 22 on that case);
        - **scores that span tens**: the outliers alone take ``q.k / sqrt(d)`` to a
          standard deviation of ~5-8 and extremes of 15-30 (measured on llama,
          qwen3, gemma2/3), where a float16 softmax without max subtraction
          overflows and a low-precision accumulation loses what a real model loses;
          a family whose QK norm erases the projections' scale gets it through the
          norm's weight instead (``qk_norm_names``, 2.5x), as trained qwen3 / gemma3
          do. ``qk_weight_names`` are the projections a family may scale (1x here).

        A norm in the ``(1 + w)`` convention (``input_norm_kind == "rms1p"``) is scaled
        in its effective weight: ``w' = f (1 + w) - 1``.

        ``weights="trained"`` also gives the recurrent layers long memory (``trained_apply``)."""

        plan = self.realistic_plan(config, seed, weights)
        with torch.no_grad():
            for name, p in model.named_parameters():
                self.realistic_apply(name, p, plan)

    def realistic_plan(self, config, seed: int, weights: str = "realistic") -> dict:
        """What ``realistic_weights`` draws once for a model (its own generator): the
        outlier channels, their factors and signs; ``trained``: the seed of the decays."""

        hidden = int(config.hidden_size if hasattr(config, "hidden_size") else getattr(config, "d_model"))
        gen = torch.Generator().manual_seed(10_007 + seed)
        k = max(2, hidden // 64)
        chans = torch.randperm(hidden, generator=gen)[:k]
        emb_f = 20.0 + 80.0 * torch.rand(k, generator=gen, dtype=torch.float64)
        norm_f = 1.0 + (3.0 - 1.0) * torch.rand(k, generator=gen, dtype=torch.float64)
        sign = torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0).double()
        offset = 1.0 if getattr(self, "input_norm_kind", "rms") == "rms1p" else 0.0
        return {"hidden": hidden, "chans": chans, "emb_f": emb_f, "norm_f": norm_f, "sign": sign, "offset": offset,
                "qk_f": 1.0, "qk_norm_f": 2.5, "trained": None if weights != "trained" else 20_011 + seed}

    def realistic_apply(self, name: str, p, plan: dict) -> None:
        """``realistic_weights``' step for ONE parameter (its tensor changed in place,
        under no_grad): each parameter's own, so a model written tensor by tensor as it
        is drawn (gguf/stream.py ``export_streamed``) takes the same values."""
        hidden, chans, offset = plan["hidden"], plan["chans"], plan["offset"]
        if plan.get("trained") is not None and self.trained_apply(name, p, plan["trained"]):
            return
        if p.ndim == 2 and p.shape[-1] == hidden and ("embed" in name or name.endswith(("wte.weight",
                                                                                       "word_embeddings.weight"))):
            p[:, chans] = ((p[:, chans].double() + COHERENT * plan["sign"]) * plan["emb_f"]).to(p.dtype)
        elif p.ndim == 1 and p.shape[0] == hidden and "norm" in name and not name.endswith("bias"):
            p[chans] = ((p[chans].double() + offset) * plan["norm_f"] - offset).to(p.dtype)
        elif p.ndim == 2 and name.endswith(self.qk_weight_names):
            p.mul_(plan["qk_f"])
        elif p.ndim == 1 and name.endswith(self.qk_norm_names):
            # a QK norm erases the projections' scale: its weight carries it (trained
            # qwen3 / gemma3 q_norm and k_norm weights sit well above 1)
            p.copy_(((p.double() + offset) * plan["qk_norm_f"] - offset).to(p.dtype))

    def trained_apply(self, name: str, p, seed: int) -> bool:
        """``weights="trained"``: a recurrent layer's decay parameters as a trained
        checkpoint spreads them, so that some channels remember for hundreds of rows
        (issue 40: on ``random`` weights every channel forgets in a few rows, and a
        state kept in bfloat16 never accumulates its rounding). True where ``p`` was
        one of them (changed in place).

        The decay per row is ``exp(-A * dt)``, ``dt = softplus(dt_bias + input term)``
        (HF Qwen3NextGatedDeltaNet ``g = -A_log.exp() * softplus(a + dt_bias)``,
        KimiDeltaAttention's forget gate, Mamba2Mixer / MambaMixer ``dA = exp(dt * A)``),
        so a channel's memory is ``~1 / (A dt)`` rows:

        - ``dt_bias`` / ``dt_proj.bias``: the inverse softplus of ``dt`` log-uniform in
          ``TRAINED_DT`` (HF Mamba2Mixer and MambaMixer init, KimiLinear's
          ``_init_weights``; mamba_ssm's and FLA's GatedDeltaNet's ``dt_min`` / ``dt_max``);
        - ``A_log`` of one value per head or channel: ``log(A)``, A uniform in
          ``TRAINED_A`` (KimiLinear's init, mamba_ssm's ``A_init_range``; Qwen3Next's
          is (0.01, 16)); Mamba-1's ``[d_inner, N]`` A_log: S4D-real, ``log(1..N)`` along
          the state (HF MambaMixer.__init__), which trained Mamba checkpoints keep close to.

        The draws are stratified, not i.i.d.: element i of n takes the quantile
        ``(rank_i + u_i) / n`` of its range, the ranks a seeded permutation drawn from the
        layer's module path, which A_log and dt_bias of the SAME module share -- so at any
        head count the heads span the time scales, and the head with the smallest dt also
        has the smallest A: its memory is ~1 / (1 * 1e-3) = 1000 rows (at 4 heads the
        slowest head remembers >= 1 / (4.75 * 3.2e-3) ~ 65 rows, typically hundreds), where
        seeded O(1) weights give every head a memory of one to a few rows."""

        prefix, _, leaf = name.rpartition(".")
        if leaf == "bias" and prefix.endswith("dt_proj"):
            leaf, prefix = "dt_bias", prefix.rpartition(".")[0]
        if leaf not in ("A_log", "dt_bias"):
            return False
        n = p.numel()
        if leaf == "A_log" and p.ndim == 2:  # Mamba-1 [d_inner, N]: S4D-real
            a = torch.arange(1, p.shape[-1] + 1, dtype=torch.float64).expand(p.shape[0], -1)
            p.copy_(a.log().to(p.dtype))
            return True
        gen = torch.Generator().manual_seed(seed + zlib.crc32(prefix.encode()))
        q = (torch.randperm(n, generator=gen).double() + torch.rand(n, generator=gen, dtype=torch.float64)) / n
        if leaf == "A_log":
            lo, hi = TRAINED_A
            value = (lo + (hi - lo) * q).log()
        else:
            lo, hi = TRAINED_DT
            dt = (math.log(lo) + (math.log(hi) - math.log(lo)) * q).exp()
            value = dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt), as the references' init writes it
        p.copy_(value.reshape(p.shape).to(p.dtype))
        return True

    def init_weights(self, model, seed: int) -> None:
        """Seeded weights with O(1) activations: HF's own init (std 0.02) leaves the
        attention nearly uniform, where a wrong scale or mask hardly shows."""

        with torch.no_grad():
            for _, p, value in self.init_draws(model, seed):
                p.copy_(value)

    def init_draws(self, model, seed: int, initial=None):
        """``(name, parameter, seeded value)`` of every parameter of ``model``, in the order
        ``init_weights`` draws them (sorted names, one generator): its one body, for a
        model held (each value then copied in) or one built on the meta device and
        written tensor by tensor as it is drawn (gguf/stream.py ``export_streamed``).
        ``initial(name, p)``: the parameter's value as HF initialised it, which
        ``init_value`` reads for a norm (default: the parameter itself)."""

        gen = torch.Generator().manual_seed(seed)
        # drawn in float64 for the tiny models (their captures and the committed baseline
        # were made so); a real-size model's are drawn in float32, 5x faster (a 1B model's
        # float64 draws alone took 60 s on 2 cores; scripts/bench_real_size.py)
        draw = torch.float64 if sum(p.numel() for p in model.parameters()) <= INIT_FLOAT64_MAX else torch.float32
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            r = torch.randn(p.shape, generator=gen, dtype=draw)
            yield name, p, self.init_value(name, p if initial is None else initial(name, p), r).to(p.dtype)

    def init_value(self, name: str, p, r):
        leaf = name.rsplit(".", 2)
        if "embed" in name or name.endswith("wte.weight") or name.endswith("word_embeddings.weight"):
            return r
        if p.ndim >= 2:
            return r / np.sqrt(p.shape[-1])
        if name.endswith("bias"):
            return 0.1 * r
        if "norm" in name or "ln" in leaf[-2]:
            # around whatever HF initialised (1 for w, 0 for gemma's 1 + w)
            return p.detach().to(r.dtype) + 0.1 * r
        return r

    # ------------------------------------------------------------------ impl
    def layer_configs(self, config, variant: str | None = None) -> list[LayerConfig | NotInImpl]:
        return [self.layer_config(config, i) for i in range(config.num_hidden_layers)]

    def layer_config(self, config, i: int) -> LayerConfig | NotInImpl:
        raise NotImplementedError

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def ggml_input_orders(self, desc) -> dict:
        """impl weight name -> the order of its input columns in the GGUF, where the
        converter permuted them (default: none): ggml quantizes an activation row in
        blocks of the FILE's columns (harness/references/llamacpp/ggml_matmul.py)."""
        return {}

    def finding_values(self, config) -> dict:
        """Values this family reads from a reference's config where no config key says
        them, for its findings' conditions (``config = { "family.NAME" = ... }``,
        harness/policy.py config_value): gemma3n's KV sharing and activation sparsity as
        llama.cpp's fixed rules make them. Default: none."""
        return {}

    def variant_weights(self, weights: dict, config, i: int, variant: str | None) -> dict:
        """Layer ``i``'s impl weights (``layer_weights``' dict) as a named variant
        stores them (default: every variant reads the same weights; llama's
        ``wo_scale`` keeps ``wo / s`` beside its ``{1}`` scale companion ``s``)."""
        return weights


def tensor(module, name: str) -> np.ndarray | None:
    """A parameter (or None) as float64 NumPy, by dotted path."""
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj.detach().to(dtype=__import__("torch").float64).cpu().numpy()


def hf_default_rope_reads(config_class, key: str) -> bool:
    """Whether the HF modeling file beside ``config_class`` reads ``key`` where it builds
    its default RoPE (``*RotaryEmbedding.compute_default_rope_parameters``, read from its
    source). LlamaRotaryEmbedding's sizes the rotation ``head_dim`` whatever
    ``partial_rotary_factor`` says (modeling_llama.py: ``dim = getattr(config, "head_dim",
    None) or ...``), where modeling_rope_utils' scaled types and phi's, glm's ... read it.
    No such method found: True (the key is taken as read)."""
    return _default_rope_reads(getattr(config_class, "__module__", ""), key)


@functools.lru_cache(maxsize=None)
def _default_rope_reads(config_module: str, key: str) -> bool:
    try:
        mod = importlib.import_module(config_module.replace(".configuration_", ".modeling_"))
    except ImportError:
        return True
    found = [c.compute_default_rope_parameters for c in vars(mod).values()
             if isinstance(c, type) and c.__module__ == mod.__name__ and "compute_default_rope_parameters" in vars(c)]
    if not found:
        return True
    try:
        return any(key in inspect.getsource(f) for f in found)
    except (OSError, TypeError):
        return True


def rope_from_config(config, layer_type: str | None = None, layout: str = "neox", head_dim: int | None = None,
                     default_partial: bool = True):
    """impl RoPE from transformers 5's ``config.rope_parameters`` (per layer type
    where the family keys them so). ``default_partial``: whether the default RoPE type
    rotates only ``partial_rotary_factor`` of the head (``hf_default_rope_reads``)."""
    params = config.rope_parameters or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    params = dict(params)
    kind = params.get("rope_type", "default")
    theta = params["rope_theta"]
    hd = head_dim or getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    prf = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    if kind == "default" and not default_partial:
        prf = 1.0
    # proportional (gemma4): every pair of the head is in the table, the still ones at 0
    rot = hd if kind == "proportional" else int(hd * prf)
    if kind == "yarn":
        params.setdefault("max_position_embeddings", config.max_position_embeddings)
    spec = make_rope(kind, theta, rot, layout, params)
    factors = params.get("freq_factors")
    if factors is not None:
        # a GGUF's rope_freqs tensor (ggml_rope_ext freq_factors: theta_i / ff_i), read
        # back by --gguf where no HF RoPE type reproduces it (references/hf/rope.py apply_freq_factors)
        spec = dataclasses.replace(spec, inv_freq=tuple(f / float(ff) for f, ff in zip(spec.inv_freq, factors)))
    return spec


class LlamaLike(Family):
    """HF ``LlamaForCausalLM``'s shape; the default probe map reads:

    layer_in   decoder layer input          attn_in   self_attn input
    q, k, v    {q,k,v}_proj outputs          attn_branch  o_proj input
    attn_out   self_attn output[0]          resid_mid post_attention_layernorm input
    layer_out  decoder layer output
    and, from the wrapped eager attention: q_rope, k_rope, attn_probs, attn_heads.
    """

    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attn", "in"),
        "q": Point("self_attn.q_proj", "out"),
        "k": Point("self_attn.k_proj", "out"),
        "v": Point("self_attn.v_proj", "out"),
        "attn_branch": Point("self_attn.o_proj", "in"),
        "attn_out": Point("self_attn", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    # The layer's decorations as the family's HF modules define them (``layer_config``
    # reads them; a family states only what differs, citing its HF module):
    # the input norm's kind (impl NormSpec: "rms" LlamaRMSNorm, "rms1p" gemma's
    # (1 + w), "layer" LayerNorm), a norm on the branch before the residual (None:
    # none), the QK norm (its eps is the layer's), the RoPE layout, and whether the
    # RoPE parameters are keyed per layer type (``rope_parameters[layer_types[i]]``).
    input_norm_kind = "rms"
    post_norm_kind: str | None = None
    qk_norm: QkNormSpec | None = None
    rope_layout = "neox"
    rope_per_layer_type = False
    extra_settable = ("head_dim",)  # HF *Attention.__init__: getattr(config, "head_dim", hidden // heads)

    def head_dim(self, config) -> int:
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def layer_widths(self, config, i: int) -> tuple[int, int]:
        """Layer ``i``'s ``(head_dim, n_kv_heads)`` (the same for every layer here)."""
        return self.head_dim(config), config.num_key_value_heads

    def norm_eps(self, config) -> float:
        """The eps of the layer's norms (input, QK, post)."""
        return config.rms_norm_eps

    def window(self, config, i: int) -> WindowSpec | None:
        types = getattr(config, "layer_types", None)
        if types and types[i] == "sliding_attention" and getattr(config, "sliding_window", None):
            return WindowSpec("sliding", int(config.sliding_window))
        return None

    def uses_rope(self, config, i: int) -> bool:
        """Whether layer ``i`` rotates Q and K (False: a NoPE layer)."""
        return True

    def rope(self, config, i: int, head_dim: int):
        if not self.uses_rope(config, i):
            return None
        layer_type = config.layer_types[i] if self.rope_per_layer_type else None
        return rope_from_config(config, layer_type, layout=self.rope_layout, head_dim=head_dim,
                                default_partial=hf_default_rope_reads(self.config_class(), "partial_rotary_factor"))

    def layer_config(self, config, i: int) -> LayerConfig:
        """Layer ``i`` from the hooks above; a family adds what else it has with
        ``super().layer_config(config, i).replace(...)``."""
        hd, n_kv = self.layer_widths(config, i)
        eps = self.norm_eps(config)
        return LayerConfig(
            hidden_size=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_kv_heads=n_kv,
            head_dim=hd,
            input_norm=NormSpec(self.input_norm_kind, eps),
            rope=self.rope(config, i, hd),
            window=self.window(config, i),
            qk_norm=None if self.qk_norm is None else dataclasses.replace(
                self.qk_norm, norm=NormSpec(self.qk_norm.norm.kind, eps)),
            post_norm=None if self.post_norm_kind is None else NormSpec(self.post_norm_kind, eps),
        )

    # HF name (relative to the decoder layer) -> impl weight name
    weight_map = {
        "input_layernorm.weight": "attn_norm",
        "self_attn.q_proj.weight": "wq",
        "self_attn.q_proj.bias": "bq",
        "self_attn.k_proj.weight": "wk",
        "self_attn.k_proj.bias": "bk",
        "self_attn.v_proj.weight": "wv",
        "self_attn.v_proj.bias": "bv",
        "self_attn.o_proj.weight": "wo",
        "self_attn.o_proj.bias": "bo",
        "self_attn.q_norm.weight": "q_norm",
        "self_attn.k_norm.weight": "k_norm",
    }

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layer(model, config, i)  # (a cycled model's: the module layer i runs)
        out = {}
        for hf_name, ours in self.weight_map.items():
            t = tensor(layer, hf_name)
            if t is not None:
                out[ours] = t
        return out


def post_norm_points(resid_mid: str) -> dict[str, Point]:
    """``LlamaLike.hf_points`` of a decoder layer that norms the attention output
    before the residual add: ``attn_out`` is ``post_attention_layernorm``'s output
    (what the residual adds), ``resid_mid`` the input of ``resid_mid``, the module
    that reads the residual after it (LlamaLike's points would read the un-normed
    branch and a residual that does not exist)."""
    return {**LlamaLike.hf_points, "attn_out": Point("post_attention_layernorm", "out"),
            "resid_mid": Point(resid_mid, "in")}


@dataclass
class FamilyInfo:
    """What `conformance list` prints for a family."""
    name: str
    hf_model_type: str
    features: list[str] = field(default_factory=list)
    gguf_arch: str | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
