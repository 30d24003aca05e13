"""What a model family knows: its tiny HF config, its seeded weights, how its
weights and hyper-parameters map into impl, and where its probes live in HF.

A family is data plus a few small methods; ``LlamaLike`` covers the shape most
decoder-only families share (``model.layers[i].self_attn.{q,k,v,o}_proj``,
``input_layernorm``, ``post_attention_layernorm``) so a family module states
only what differs, with a comment citing the HF module it mirrors.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from impl import LayerConfig, NormSpec, QkNormSpec, WindowSpec, make_rope
from impl.config import ConfigError

from ..errors import UsageError, suggest

# Generic PretrainedConfig fields a user has no business setting through --set.
_GENERIC_FIELDS = {
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
    "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type",
    "use_cache", "initializer_range",
}


@dataclass(frozen=True)
class Point:
    """Where a probe is read in HF: a module path relative to the decoder layer
    ('' is the layer itself) and whether its input or its output is taken."""

    path: str
    io: str  # "in" | "out"


@dataclass(frozen=True)
class LcPoint:
    """Where a probe is read in llama.cpp's graph: a callback name (``cb(cur,
    name, il)``), which occurrence of it (``pick``: ``last``, ``first``,
    ``pre_rope`` -- the last one before the ROPE node --, ``rope`` -- the ROPE
    node itself --, or ``op:NAME``), and its layout: ``rows`` ([tokens,
    channels]), ``heads`` ([tokens, heads, dim]) or ``probs`` ([streams, heads,
    tokens, kv cells])."""

    name: str
    pick: str = "last"
    layout: str = "rows"


@dataclass(frozen=True)
class NotInImpl:
    """A layer impl does not implement (a linear-attention / delta-net layer): the
    report lists it by name, and the references are still compared with each other."""

    kind: str
    reason: str


class Family:
    name: str = ""
    hf_model_type: str = ""
    description: str = ""
    # Per-family sizes, passed as kwargs at construction so derived fields
    # (layer_types, head_dim, ...) come out right.
    tiny: dict = {}
    declared_features: tuple[str, ...] = ()
    layers_path = "model.layers"
    hf_points: dict[str, Point] = {}
    # model-level probes: name -> (module path from the model root, "in"/"out")
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.norm", "out")}
    # The eager attention function the attention module calls, by its name in the
    # module's own modeling file (wrapped during capture to read q_rope, k_rope,
    # attn_probs, attn_heads).
    eager_name = "eager_attention_forward"
    # The llama.cpp architecture the GGUF export writes (None: no llama.cpp reference).
    gguf_arch: str | None = None
    # Named variants of the family's impl mapping and GGUF export (MLA: the naive
    # and absorbed forms); the first is the default.
    variants: tuple[str, ...] = ()

    # llama.cpp's probe points, per layer; a probe not named here is "not exposed".
    lc_points: dict[str, LcPoint] = {
        "attn_in": LcPoint("attn_norm"),
        "q": LcPoint("Qcur", "pre_rope", "heads"),
        "k": LcPoint("Kcur", "pre_rope", "heads"),
        "v": LcPoint("Vcur", "last", "heads"),
        "q_rope": LcPoint("Qcur", "rope", "heads"),
        "k_rope": LcPoint("Kcur", "rope", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint("attn_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    # model-level: the first layer's input, the final norm, the logits
    lc_model_points: dict[str, LcPoint] = {
        "embeddings": LcPoint("embd"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }

    # ------------------------------------------------------------------ config
    def config_class(self):
        from transformers import AutoConfig

        return type(AutoConfig.for_model(self.hf_model_type))

    # Config attributes the modeling code reads with getattr() although the config
    # class does not declare them (e.g. HF Qwen2Attention: getattr(config, "head_dim", ...)).
    extra_settable: tuple[str, ...] = ()

    def settable_keys(self) -> list[str]:
        cls = self.config_class()
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(vars(cls()))
        names += list(self.extra_settable)
        return sorted({n for n in names if n not in _GENERIC_FIELDS and not n.startswith("_")})

    def config_kwargs(self, overrides: dict) -> dict:
        kw = json.loads(json.dumps(self.tiny))  # deep copy
        valid = self.settable_keys()
        for key, value in overrides.items():
            top, _, sub = key.partition(".")
            if top not in valid:
                raise UsageError(f"unknown config key {key!r} for family {self.name}; {suggest(top, valid)}")
            if sub:
                base = kw.get(top)
                if base is None:
                    base = dict(getattr(self.config_class()(), top, None) or {})
                if not isinstance(base, dict):
                    raise UsageError(f"config key {top!r} is not a table; set it as {top}=VALUE")
                base = dict(base)
                base[sub] = value
                kw[top] = base
            else:
                kw[key] = value
        return kw

    def make_config(self, overrides: dict | None = None):
        from transformers import AutoConfig

        kw = self.config_kwargs(overrides or {})
        self.validate(kw)
        try:
            config = AutoConfig.for_model(self.hf_model_type, **kw)
        except (ValueError, TypeError, KeyError) as e:
            raise UsageError(f"family {self.name}: the HF config refused these settings: {_one_line(e)}") from None
        self.validate_config(config)
        return config

    def validate(self, kw: dict) -> None:
        """Shape checks HF itself does not make (it would build a model that
        silently truncates, or fail deep inside a forward)."""
        h, nh = kw.get("hidden_size"), kw.get("num_attention_heads")
        nkv = kw.get("num_key_value_heads", nh)
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim"):
            v = kw.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise UsageError(f"{name} must be a positive integer, got {v!r}")
        if nh and nkv and nh % nkv:
            divs = [d for d in range(1, nh + 1) if nh % d == 0]
            raise UsageError(
                f"num_key_value_heads={nkv} does not divide num_attention_heads={nh}; valid: {', '.join(map(str, divs))}"
            )
        if kw.get("head_dim") is None and h and nh and h % nh:
            divs = [d for d in range(1, h + 1) if h % d == 0]
            raise UsageError(
                f"num_attention_heads={nh} does not divide hidden_size={h} (and no head_dim is set); "
                f"valid head counts: {', '.join(map(str, divs))}, or set head_dim"
            )

    def validate_config(self, config) -> None:
        try:
            self.layer_configs(config, self.variants[0] if self.variants else None)
        except ConfigError as e:
            raise UsageError(f"family {self.name}: {e}") from None

    # ------------------------------------------------------------------ model
    def build_model(self, config, seed: int, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
        self.init_weights(model, seed)
        model = model.to(dtype=getattr(torch, dtype)).eval()
        return model

    def init_weights(self, model, seed: int) -> None:
        """Seeded weights with O(1) activations: HF's own init (std 0.02) leaves the
        attention nearly uniform, where a wrong scale or mask hardly shows."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
                p.copy_(self.init_value(name, p, r).to(p.dtype))

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

    def decoder_layers(self, model):
        obj = model
        for part in self.layers_path.split("."):
            obj = getattr(obj, part)
        return list(obj)

    # ------------------------------------------------------------------ impl
    def layer_configs(self, config, variant: str | None = None) -> list[LayerConfig | NotInImpl]:
        return [self.layer_config(config, i) for i in range(config.num_hidden_layers)]

    def layer_config(self, config, i: int) -> LayerConfig | NotInImpl:
        raise NotImplementedError

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int) -> dict[str, Point]:
        """The probe points of layer ``i`` (families with mixed layer kinds override)."""
        return self.hf_points

    def hf_taps(self, model, config, sink: dict):
        """A context manager held around the HF forward that records probes neither
        a module hook nor the eager-function wrapper can read -- for models whose
        attention math is inline (bloom, mpt: no ``eager_attention_forward``).
        It writes ``sink[layer_idx][probe] = float64 array``, as the eager wrapper
        does (``hf_canonical`` then applies). Default: nothing."""
        import contextlib

        return contextlib.nullcontext()

    def hf_derived(self, probes: dict, config, layer_cfgs) -> dict:
        """Probes HF exposes only as views of other captured (canonical) tensors,
        ``{"L{i}.{probe}": array}`` (default: none; MLA families slice the rope
        part out of the query and key the eager attention reads)."""
        return {}

    def hf_canonical(self, probe: str, arr: np.ndarray, lc: LayerConfig) -> np.ndarray:
        """HF's tensor for ``probe`` ([seqs, ...]) in the canonical layout."""
        if not isinstance(lc, LayerConfig) or lc.shape != "gqa":
            return arr
        s, t = arr.shape[0], arr.shape[1] if arr.ndim > 1 else None
        if probe == "q":
            return arr.reshape(s, t, lc.n_heads, lc.head_dim)
        if probe == "k":
            return arr.reshape(s, t, lc.n_kv_heads, lc.head_dim)
        if probe == "v":
            return arr.reshape(s, t, lc.n_kv_heads, lc.dv)
        if probe in ("q_rope", "k_rope"):  # eager: [S, heads, T, D]
            return arr.transpose(0, 2, 1, 3)
        return arr


    def lc_points_for(self, config, i: int) -> dict[str, LcPoint]:
        return self.lc_points

    def lc_layer_input(self, config, i: int) -> tuple[str, LcPoint]:
        """Where layer ``i``'s input lives in llama.cpp: the embeddings for layer 0,
        the previous layer's ``l_out`` after that."""
        if i == 0:
            return "embeddings", self.lc_model_points["embeddings"]
        return f"L{i - 1}.layer_out", LcPoint("l_out")

    def lc_canonical(self, probe: str, arr: np.ndarray, lc, config) -> np.ndarray:
        """llama.cpp's array ([seqs, tokens, ...] after token placement) in the
        canonical layout: reshape head-major rows, undo converter permutations."""
        return self.hf_canonical_heads(probe, arr, lc)

    def hf_canonical_heads(self, probe: str, arr: np.ndarray, lc) -> np.ndarray:
        if not isinstance(lc, LayerConfig) or lc.shape != "gqa":
            return arr
        if probe == "attn_heads" and arr.ndim == 3:
            return arr.reshape(arr.shape[0], arr.shape[1], lc.n_heads, lc.dv)
        return arr

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant: str | None = None) -> None:
        """The metadata llama.cpp reads for the arch: conversion/base.py
        ``TextModel.set_gguf_parameters`` plus the arch's own additions."""
        import gguf

        w.add_block_count(config.num_hidden_layers)
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads)
        rp = dict(config.rope_parameters or {})
        rp = rp.get("full_attention", rp)
        if rp.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rp["factor"])
        elif rp.get("rope_type") == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(rp["factor"])
            w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
            for key, fn in (("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                            ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                            ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
                if rp.get(key) is not None:
                    fn(rp[key])
        if rp.get("rope_theta") is not None:
            w.add_rope_freq_base(rp["rope_theta"])
        eps = getattr(config, "rms_norm_eps", None)
        if eps is not None:
            w.add_layer_norm_rms_eps(eps)
        hd = getattr(config, "head_dim", None)
        if hd is not None:
            w.add_key_length(hd)
            w.add_value_length(hd)
        # conversion/llama.py LlamaModel.set_gguf_parameters
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(hd or config.hidden_size // config.num_attention_heads)

    def gguf_transform(self, name: str, data: np.ndarray, config) -> np.ndarray:
        """A tensor transform the converter applies (default: none)."""
        return data

    def gguf_tensors(self, model, config, variant: str | None = None):
        """``(gguf_name, array)`` for every HF tensor, transformed and renamed with
        gguf's own tensor map (``get_tensor_name_map``), as ``modify_tensors`` does."""
        import gguf

        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[self.gguf_arch]
        tmap = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
        for name, p in model.state_dict().items():
            data = p.detach().to(dtype=__import__("torch").float32).cpu().numpy()
            data = self.gguf_transform(name, data, config)
            if data is None:
                continue
            new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ValueError(f"{self.name}: no GGUF name for HF tensor {name!r}")
            yield new, data

    # ------------------------------------------------------------------ GGUF import (--gguf)
    # The export's reverse, hook for hook (harness/refs/gguf_import.py drives it):
    #   gguf_params    -> config_from_gguf      (metadata -> HF config kwargs)
    #   gguf_transform -> gguf_untransform      (one tensor back to HF layout)
    #   gguf_tensors   -> gguf_import_tensors   (the GGUF tensors -> the HF state dict)
    _GGUF_REVERSE = (("gguf_params", "config_from_gguf"), ("gguf_transform", "gguf_untransform"),
                     ("gguf_tensors", "gguf_import_tensors"))

    def gguf_import_unsupported(self) -> str | None:
        """Why ``--gguf`` cannot read this family's files (None: it can). A reverse
        hook must be defined at least as deep in the class tree as the export hook
        it inverts: a family that overrides ``gguf_params`` but not
        ``config_from_gguf`` would otherwise read its files with a reverse that
        does not match its export."""
        if not self.gguf_arch:
            return "the family has no GGUF export (no llama.cpp arch)"
        mro = type(self).__mro__

        def depth(name):
            return next(i for i, c in enumerate(mro) if name in vars(c))

        for fwd, rev in self._GGUF_REVERSE:
            if depth(rev) > depth(fwd):
                return (f"its export overrides {fwd} and no reverse {rev} is written yet "
                        f"(harness/families/base.py: GGUF import)")
        return None

    def config_from_gguf(self, meta, shapes: dict[str, tuple]) -> dict:
        """HF config kwargs from a GGUF's metadata, the reverse of ``gguf_params``.
        ``meta.get("attention.head_count")`` reads ``{arch}.attention.head_count``
        (and records the read: an arch key no reverse reads is refused);
        ``shapes``: GGUF tensor name -> shape in HF order. A family extends this
        (calling super) for the keys its ``gguf_params`` adds."""
        from ..refs.gguf_import import text_config_from_gguf

        return text_config_from_gguf(self, meta, shapes)

    def gguf_untransform(self, name: str, data: np.ndarray, config) -> np.ndarray:
        """The inverse of ``gguf_transform`` for HF tensor ``name`` (default: none)."""
        return data

    def gguf_import_tensors(self, tensors: dict, model, config) -> dict[str, np.ndarray]:
        """The HF state dict of ``model`` from the GGUF's tensors (gguf name -> a
        callable giving float32 numpy): gguf's tensor-name map run backwards,
        then ``gguf_untransform``. Every HF tensor must be found, every GGUF
        tensor used."""
        from ..refs.gguf_import import import_by_name_map

        return import_by_name_map(self, tensors, model, config)


    # ------------------------------------------------------------------ bisection
    def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
        """Config overrides that switch one feature OFF in the reference -- and so
        in impl, which derives its layers from the same config. Used by feature
        bisection; a family extends this (calling super) for what only it knows.
        Only settings HF itself honours belong here."""
        sw: dict[str, dict] = {}
        keys = set(self.settable_keys())
        types = list(getattr(config, "layer_types", None) or [])
        if "sliding_window" in features and types and "layer_types" in keys:
            o = {"layer_types": ["full_attention" if t == "sliding_attention" else t for t in types]}
            if "use_sliding_window" in keys:
                o["use_sliding_window"] = False
            sw["sliding_window"] = o
        if "qkv_bias" in features and "attention_bias" in keys:
            sw["qkv_bias"] = {"attention_bias": False}
        rp = dict(config.rope_parameters or {}) if "rope_parameters" in keys else {}
        if "rope_scaling" in features and rp.get("rope_type", "default") != "default" and "rope_theta" in rp:
            sw["rope_scaling"] = {"rope_parameters": {"rope_type": "default", "rope_theta": rp["rope_theta"]}}
        if "softcap" in features and "attn_logit_softcapping" in keys:
            sw["softcap"] = {"attn_logit_softcapping": None}
        return sw


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def tensor(module, name: str) -> np.ndarray | None:
    """A parameter (or None) as float64 NumPy, by dotted path."""
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj.detach().to(dtype=__import__("torch").float64).cpu().numpy()


def rope_from_config(config, layer_type: str | None = None, layout: str = "neox", head_dim: int | None = None):
    """impl RoPE from transformers 5's ``config.rope_parameters`` (per layer type
    where the family keys them so)."""
    params = config.rope_parameters or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    params = dict(params)
    kind = params.get("rope_type", "default")
    theta = params["rope_theta"]
    hd = head_dim or getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    prf = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    rot = int(hd * prf)
    if kind == "yarn":
        params.setdefault("max_position_embeddings", config.max_position_embeddings)
    return make_rope(kind, theta, rot, layout, params)


def text_model_gguf_params(w, config) -> None:
    """conversion/base.py ``TextModel.set_gguf_parameters``, key for key (the
    generic metadata most converters start from with ``super()``); a family adds
    its own keys after calling it. Reads the HF config object, as the converter
    reads config.json (``find_hparam``: the first of several names present)."""
    import gguf

    def find(*names):
        for n in names:
            v = getattr(config, n, None)
            if v is not None:
                return v
        return None

    w.add_block_count(config.num_hidden_layers)
    for value, add in ((find("max_position_embeddings", "n_ctx", "n_positions"), w.add_context_length),
                       (find("hidden_size", "n_embd", "dim"), w.add_embedding_length),
                       (find("intermediate_size", "n_inner", "hidden_dim"), w.add_feed_forward_length),
                       (find("num_attention_heads", "n_head", "n_heads"), w.add_head_count),
                       (find("num_key_value_heads", "n_kv_heads"), w.add_head_count_kv)):
        if value is not None:
            add(value)
    rp_all = dict(getattr(config, "rope_parameters", None) or {})
    rp = rp_all.get("full_attention", rp_all)
    if rp.get("factor") is not None and rp.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rp["factor"])
    elif rp.get("factor") is not None and rp.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        # written when present, whether or not the arch reads them; HF's `truncate`
        # has no GGUF key at all
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rp.get(key) is not None:
                add(rp[key])
    if rp.get("rope_theta") is not None:
        w.add_rope_freq_base(rp["rope_theta"])
    swa_theta = (rp_all.get("sliding_attention") or {}).get("rope_theta")
    if swa_theta is not None:
        w.add_rope_freq_base_swa(swa_theta)
    if (eps := find("rms_norm_eps", "norm_eps")) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := find("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        w.add_layer_norm_eps(eps)
    if (n := find("num_local_experts", "num_experts", "n_routed_experts")) is not None:
        w.add_expert_count(n)
    if (n := find("num_experts_per_tok", "num_experts_per_token", "top_k_experts")) is not None:
        w.add_expert_used_count(n)
    if (hd := getattr(config, "head_dim", None)) is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)


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
    qk_norm: QkNormSpec | None = None
    extra_settable = ("head_dim",)  # HF *Attention.__init__: getattr(config, "head_dim", hidden // heads)

    def head_dim(self, config) -> int:
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def window(self, config, i: int) -> WindowSpec | None:
        types = getattr(config, "layer_types", None)
        if types and types[i] == "sliding_attention" and getattr(config, "sliding_window", None):
            return WindowSpec("sliding", int(config.sliding_window))
        return None

    def layer_config(self, config, i: int) -> LayerConfig:
        hd = self.head_dim(config)
        eps = config.rms_norm_eps
        return LayerConfig(
            hidden_size=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads,
            head_dim=hd,
            input_norm=NormSpec("rms", eps),
            rope=rope_from_config(config, head_dim=hd),
            window=self.window(config, i),
            qk_norm=None if self.qk_norm is None else dataclasses.replace(
                self.qk_norm, norm=NormSpec(self.qk_norm.norm.kind, eps)),
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
        layer = self.decoder_layers(model)[i]
        out = {}
        for hf_name, ours in self.weight_map.items():
            t = tensor(layer, hf_name)
            if t is not None:
                out[ours] = t
        return out


@dataclass
class FamilyInfo:
    """What `conformance list` prints for a family."""

    name: str
    hf_model_type: str
    features: list[str] = field(default_factory=list)
    gguf_arch: str | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
