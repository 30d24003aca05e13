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
from impl.config import ConfigError, divisors

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


INIT_FLOAT64_MAX = 1 << 24  # parameters; above it, seeded weights are drawn in float32 (Family.init_weights)


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
    # HF's experts kernel, passed to from_config where set (None: HF's default).
    # "eager": the experts' own forward loop from the modeling file; the default
    # grouped_mm kernel refuses float64 (HF at --dtype float64).
    experts_implementation: str | None = None
    # The config keys ``validate`` checks (a family whose HF config names its sizes
    # otherwise overrides): the roles hidden, heads, kv_heads, layers, head_dim; a
    # role the config does not have is left out.
    size_keys: dict[str, str] = {
        "hidden": "hidden_size",
        "heads": "num_attention_heads",
        "kv_heads": "num_key_value_heads",
        "layers": "num_hidden_layers",
        "head_dim": "head_dim",
    }

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
        # the class itself, not type(an instance): HF's default Starcoder2Config
        # (vocab 49152, bos/eos 50256) warns "got 50256" each time it is built
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        return CONFIG_MAPPING[self.hf_model_type]

    # Config attributes the modeling code reads with getattr() although the config
    # class does not declare them (e.g. HF Qwen2Attention: getattr(config, "head_dim", ...)).
    extra_settable: tuple[str, ...] = ()

    def settable_keys(self) -> list[str]:
        cls = self.config_class()
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(vars(cls()))
        names += list(self.extra_settable)
        return sorted({n for n in names if n not in _GENERIC_FIELDS and not n.startswith("_")})

    def apply_overrides(self, d: dict, overrides: dict, table_default=None) -> dict:
        """``overrides`` (``--set`` keys; ``top.sub`` sets one key of the table
        ``top``) applied to the config dict ``d`` in place; a key the family does
        not offer is refused. ``table_default(top)``: the table a ``top.sub`` key
        starts from where ``d`` has none (default: an empty one)."""
        from .. import config_values

        valid = self.settable_keys()
        tables = {}  # the family's own tables, before the overrides: what a dotted key is checked against
        for key, value in overrides.items():
            top, _, sub = key.partition(".")
            if top not in valid:
                raise UsageError(f"unknown config key {key!r} for family {self.name}; {suggest(top, valid)}")
            value = config_values.override_value(self, key, value)
            if sub:
                base = d.get(top)
                if base is None and table_default is not None:
                    base = table_default(top)
                if base is not None and not isinstance(base, dict):
                    raise UsageError(f"config key {top!r} is not a table; set it as {top}=VALUE")
                tables.setdefault(top, json.loads(json.dumps(base or {})))
                base = dict(base or {})
                base[sub] = value
                d[top] = base
            else:
                d[key] = value
        config_values.check_tables(self, d, overrides, tables, table_default)
        return d

    def config_kwargs(self, overrides: dict) -> dict:
        kw = json.loads(json.dumps(self.tiny))  # deep copy
        from ..config_values import default_table

        return self.apply_overrides(kw, overrides, lambda top: default_table(self.config_class(), top))

    def make_config(self, overrides: dict | None = None):
        kw = self.config_kwargs(overrides or {})
        return self.config_from_kwargs(kw, f"family {self.name}: the HF config refused these settings")

    def config_from_kwargs(self, kw: dict, refused: str):
        """The HF config from ``kw``, checked before (``validate``) and after
        (``validate_config``); ``refused`` starts the error where HF refuses it."""
        from transformers import AutoConfig

        self.validate(kw)
        from ..config_values import hf_refusals, refusal

        try:
            config = AutoConfig.for_model(self.hf_model_type, **kw)
        except hf_refusals() as e:  # huggingface_hub's strict-dataclass validation, HF's own checks
            raise refusal(e, self, kw, refused) from None
        self.validate_config(config)
        return config

    def validate(self, kw: dict) -> None:
        """Shape checks HF itself does not make (it would build a model that
        silently truncates, or fail deep inside a forward), on the config keys
        ``size_keys`` names."""
        keys = self.size_keys
        for role in ("hidden", "heads", "kv_heads", "layers", "head_dim"):
            name = keys.get(role)
            v = kw.get(name) if name else None
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise UsageError(f"{name} must be a positive integer, got {v!r}")
        hk, nk = keys["hidden"], keys["heads"]
        h, nh = kw.get(hk), kw.get(nk)
        if "kv_heads" in keys:
            nkv = kw.get(keys["kv_heads"], nh)
            if nh and nkv and nh % nkv:
                raise UsageError(f"{keys['kv_heads']}={nkv} does not divide {nk}={nh}; valid: {_divisors(nh)}")
        if "head_dim" in keys:
            if kw.get(keys["head_dim"]) is None and h and nh and h % nh:
                raise UsageError(f"{nk}={nh} does not divide {hk}={h} (and no {keys['head_dim']} is set); "
                                 f"valid head counts: {_divisors(h)}, or set {keys['head_dim']}")
        elif h and nh and h % nh:
            raise UsageError(f"{nk}={nh} does not divide {hk}={h}; valid head counts: {_divisors(h)}")

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
        kw = {} if self.experts_implementation is None else {"experts_implementation": self.experts_implementation}
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32, **kw)
        self.init_weights(model, seed)
        return model.to(dtype=getattr(torch, dtype)).eval()

    def init_weights(self, model, seed: int) -> None:
        """Seeded weights with O(1) activations: HF's own init (std 0.02) leaves the
        attention nearly uniform, where a wrong scale or mask hardly shows."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        # drawn in float64 for the tiny models (their captures and the committed baseline
        # were made so); a real-size model's are drawn in float32, 5x faster (a 1B model's
        # float64 draws alone took 60 s on 2 cores; scripts/bench_real_size.py)
        draw = torch.float64 if sum(p.numel() for p in model.parameters()) <= INIT_FLOAT64_MAX else torch.float32
        with torch.no_grad():
            for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                r = torch.randn(p.shape, generator=gen, dtype=draw)
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

    def variant_weights(self, weights: dict, config, i: int, variant: str | None) -> dict:
        """Layer ``i``'s impl weights (``layer_weights``' dict) as a named variant
        stores them (default: every variant reads the same weights; llama's
        ``wo_scale`` keeps ``wo / s`` beside its ``{1}`` scale companion ``s``)."""
        return weights

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
        if probe in ("q", "k") and arr.ndim == 3:
            # a projection read before its reshape (LcPoint layout "rows"): [seqs, tokens, heads * D]
            return arr.reshape(*arr.shape[:2], lc.n_heads if probe == "q" else lc.n_kv_heads, lc.head_dim)
        if probe == "attn_heads" and arr.ndim == 3:
            return arr.reshape(arr.shape[0], arr.shape[1], lc.n_heads, lc.dv)
        return arr

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant: str | None = None) -> None:
        """The metadata llama.cpp reads for the arch: conversion/base.py
        ``TextModel.set_gguf_parameters`` plus the arch's own additions."""
        import gguf

        gguf_size_params(w, config)
        rp = dict(config.rope_parameters or {})
        rp = rp.get("full_attention", rp)
        if rp.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rp["factor"])
        elif rp.get("rope_type") == "yarn":
            gguf_yarn_params(w, rp, ("attention_factor", "beta_fast", "beta_slow"))
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

    def gguf_convert(self, name: str, data: np.ndarray, config, variant: str | None = None):
        """One HF tensor (float32) -> the ``(hf_style_name, array)`` pairs gguf's
        tensor map names: the converter's ``modify_tensors`` / ``filter_tensors``
        for it (default: ``gguf_transform``'s one tensor, or none where it drops
        the tensor). A family whose converter renames, splits or stacks overrides."""
        data = self.gguf_transform(name, data, config)
        if data is not None:
            yield name, data

    def gguf_tensor_map(self, config):
        """gguf's own tensor-name map of the family's arch (``get_tensor_name_map``)."""
        import gguf

        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[self.gguf_arch]
        return gguf.get_tensor_name_map(arch, config.num_hidden_layers)

    def gguf_tensors(self, model, config, variant: str | None = None):
        """``(gguf_name, array)`` for every HF tensor, converted (``gguf_convert``)
        and renamed with gguf's own tensor map, as ``modify_tensors`` does."""
        import torch

        tmap = self.gguf_tensor_map(config)
        for name, p in model.state_dict().items():
            data = p.detach().to(dtype=torch.float32).cpu().numpy()
            for hf_name, out in self.gguf_convert(name, data, config, variant):
                new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
                if new is None:
                    raise ValueError(f"{self.name}: no GGUF name for HF tensor {hf_name!r}")
                yield new, out

    # ------------------------------------------------------------------ GGUF import (--gguf)
    # The export's reverse, hook for hook (harness/refs/gguf_import.py drives it):
    #   gguf_params    -> config_from_gguf      (metadata -> HF config kwargs)
    #   gguf_transform -> gguf_untransform      (one tensor back to HF layout)
    #   gguf_convert   -> gguf_import_tensors   (a renamed, split or stacked tensor back)
    #   gguf_tensors   -> gguf_import_tensors   (the GGUF tensors -> the HF state dict)
    _GGUF_REVERSE = (("gguf_params", "config_from_gguf"), ("gguf_transform", "gguf_untransform"),
                     ("gguf_convert", "gguf_import_tensors"), ("gguf_tensors", "gguf_import_tensors"))

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
        # every query head its own KV head: HF sizes k_proj / v_proj from num_key_value_heads
        nh, nkv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
        if {"gqa", "mqa"} & features and "num_key_value_heads" in keys and nh and nkv and nkv < nh:
            for tag in {"gqa", "mqa"} & features:
                sw[tag] = {"num_key_value_heads": nh}
        # RoPE neutralised: linear scaling by a factor so large that every inv_freq is
        # ~0 and the rotation is the identity (modeling_rope_utils
        # _compute_linear_scaling_rope_parameters: inv_freq /= factor; llama.cpp:
        # freq_scale = 1 / factor). The RoPE code still runs; it turns nothing.
        ident = rope_identity_overrides(config) if "rope_parameters" in keys else None
        if ident is not None:
            for tag in {"rope_neox", "rope_interleaved"} & features:
                sw[tag] = ident
        if "partial_rotary" in features and rp:
            # every channel of the head rotates: partial_rotary_factor 1 where the config
            # keeps it (rope_parameters, per layer type or flat)
            if all(isinstance(v, dict) for v in rp.values()):
                if any("partial_rotary_factor" in v for v in rp.values()):
                    sw["partial_rotary"] = {"rope_parameters": {
                        t: {**v, "partial_rotary_factor": 1.0} if "partial_rotary_factor" in v else v
                        for t, v in rp.items()}}
            elif "partial_rotary_factor" in rp:
                sw["partial_rotary"] = {"rope_parameters": {**rp, "partial_rotary_factor": 1.0}}
        if "partial_rotary" in features and "partial_rotary" not in sw and "partial_rotary_factor" in keys:
            sw["partial_rotary"] = {"partial_rotary_factor": 1.0}
        if "rope_attn_factor" in features and rp.get("rope_type") == "yarn":
            # _compute_yarn_parameters takes an explicit attention_factor as given
            sw["rope_attn_factor"] = {"rope_parameters": {**rp, "attention_factor": 1.0}}
        return sw

    def case_switches(self, case, features: set[str]) -> dict[str, dict]:
        """Case fields that switch a feature off for every side at once (the KV
        backing; a family's named variant). Used by feature bisection."""
        sw: dict[str, dict] = {}
        if "kv_paged" in features:  # the same rows through a block table, or contiguous
            sw["kv_paged"] = {"kv": "batched"}
        if "kv_evict" in features:  # every row kept (the spec's default)
            sw["kv_evict"] = {"evict": False}
        return sw

    # HF module paths (relative to a decoder layer) of the norms a module switch
    # replaces by the identity; a family whose modules are named otherwise overrides.
    switch_modules: dict[str, tuple[str, ...]] = {
        "input_norm": ("input_layernorm",),
        "qk_norm": ("self_attn.q_norm", "self_attn.k_norm"),
        "post_norm": ("post_attention_layernorm",),
        "sub_norm": ("self_attn.attn_sub_norm",),
        "output_gate": ("self_attn.gate_proj",),
    }
    # HF parameter name endings (within a decoder layer) a weight switch neutralises
    switch_params: dict[str, tuple[str, ...]] = {
        "qkv_bias": ("q_proj.bias", "k_proj.bias", "v_proj.bias", "query_key_value.bias", "qkv_proj.bias",
                     "Wqkv.bias", "c_attn.bias"),
        "o_bias": ("o_proj.bias", "self_attention.dense.bias", "attn.out_proj.bias"),
        "sinks": ("self_attn.sinks",),
    }

    def model_switches(self, config) -> dict[str, "ModelSwitch"]:
        """Features switched off (or neutralised) in the seeded model itself, where
        no config field reaches: ``Case.switch_off`` names them, ``CaseRun`` applies
        them to the model every side takes its weights from (and, for a module
        switch, to impl's layer configs). A weight switch holds for both
        references (the GGUF is exported from the switched model); a module switch
        replaces an HF module by the identity, which only the HF reference sees."""
        def weight_switch(what, tag, value):
            return ModelSwitch(what, lambda m, c, lcs: _fill_params(self, m, self.switch_params[tag], value))

        sw = {
            "qkv_bias": weight_switch("Q/K/V projection biases zeroed", "qkv_bias", 0.0),
            "o_bias": weight_switch("o_proj bias zeroed", "o_bias", 0.0),
            # -1e4 (finite in f16): exp(sink - max) underflows to 0 in every precision compared
            "sinks": weight_switch("sink logits at -1e4: they take no probability mass", "sinks", -1e4),
        }

        def module_switch(what, slots, drop, swap=None):
            def paths(lc):
                return [p for slot in slots(lc) for p in self.switch_modules.get(slot, ())]

            def edit(m, c, lcs):
                return _identity_modules(self, m, lcs, paths, swap)

            def layer(lc):
                return drop(lc) if isinstance(lc, LayerConfig) else lc

            return ModelSwitch(what, edit, layer, hf_only=True)

        def has(lc, slot):
            if not isinstance(lc, LayerConfig):
                return False
            if slot == "input_norm":
                return lc.input_norm.kind != "none"
            return getattr(lc, slot) is not None

        def none_input(lc):
            return lc.replace(input_norm=NormSpec("none", lc.input_norm.eps))

        sw["post_norm"] = module_switch("post-attention norm removed (HF module -> identity; impl post_norm None)",
                                        lambda lc: ["post_norm"] if has(lc, "post_norm") else [],
                                        lambda lc: lc.replace(post_norm=None))
        sw["sub_norm"] = module_switch("attention sub-norm removed (HF module -> identity; impl sub_norm None)",
                                       lambda lc: ["sub_norm"] if has(lc, "sub_norm") else [],
                                       lambda lc: lc.replace(sub_norm=None))
        for tag, over in (("qk_norm_head", "head"), ("qk_norm_row", "row")):
            def pre(lc, over=over):
                return has(lc, "qk_norm") and lc.qk_norm.where == "pre_rope" and lc.qk_norm.over == over

            sw[tag] = module_switch(f"{tag} removed (HF q_norm / k_norm -> identity; impl qk_norm None)",
                                    lambda lc, pre=pre: ["qk_norm"] if pre(lc) else [],
                                    lambda lc, pre=pre: lc.replace(qk_norm=None) if pre(lc) else lc)

        def is_layer(lc):
            return has(lc, "input_norm") and lc.input_norm.kind == "layer"

        sw["layernorm"] = module_switch("input LayerNorm removed (HF module -> identity; impl input norm none)",
                                        lambda lc: ["input_norm"] if is_layer(lc) else [],
                                        lambda lc: none_input(lc) if is_layer(lc) else lc)

        def rms1p_slots(lc):
            if not isinstance(lc, LayerConfig):
                return []
            out = ["input_norm"] if lc.input_norm.kind == "rms1p" else []
            out += ["qk_norm"] if lc.qk_norm is not None and lc.qk_norm.norm.kind == "rms1p" else []
            return out + (["post_norm"] if lc.post_norm is not None and lc.post_norm.kind == "rms1p" else [])

        def rms1p_plain(lc):
            # the same norms in the plain convention: x / rms(x) * w' with w' = 1 + w
            kw = {}
            slots = rms1p_slots(lc)
            if "input_norm" in slots:
                kw["input_norm"] = dataclasses.replace(lc.input_norm, kind="rms")
            if "qk_norm" in slots:
                kw["qk_norm"] = dataclasses.replace(lc.qk_norm, norm=dataclasses.replace(lc.qk_norm.norm, kind="rms"))
            if "post_norm" in slots:
                kw["post_norm"] = dataclasses.replace(lc.post_norm, kind="rms")
            return lc.replace(**kw) if kw else lc

        sw["rms1p"] = module_switch("every (1 + w) norm turned into a plain RMS norm with weight 1 + w "
                                    "(HF module -> LlamaRMSNorm; impl kind rms)", rms1p_slots, rms1p_plain,
                                    swap=_plain_rms)

        def separate_gate(lc):
            return isinstance(lc, LayerConfig) and lc.output_gate

        sw["output_gate"] = module_switch("the output gate held open (HF gate projection -> a constant 1e4, "
                                          "sigmoid = 1; impl output_gate off)",
                                          lambda lc: ["output_gate"] if separate_gate(lc) else [],
                                          lambda lc: lc.replace(output_gate=False) if separate_gate(lc) else lc,
                                          swap=_open_gate)
        return sw


@dataclass(frozen=True)
class ModelSwitch:
    """One feature switched off in the seeded model (see ``Family.model_switches``).

    ``edit(model, config, layer_cfgs)`` changes the model in place and returns how
    many tensors or modules it changed (0: the feature is not there to switch);
    ``layer(lc)`` tells impl the same (a module switch), None for a weight switch,
    which neutralises weights impl reads from the model anyway."""

    what: str
    edit: Any
    layer: Any = None
    hf_only: bool = False


def _fill_params(family, model, endings: tuple[str, ...], value: float) -> int:
    import torch

    n = 0
    with torch.no_grad():
        for layer in family.decoder_layers(model):
            for name, p in layer.named_parameters():
                if name.endswith(endings):
                    p.fill_(value)
                    n += 1
    return n


def _plain_rms(module):
    """A ``(1 + w)`` RMS norm module as HF ``LlamaRMSNorm`` with weight ``1 + w``."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    w = module.weight.detach()
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", 1e-6))
    new = LlamaRMSNorm(w.shape[-1], eps=eps).to(w.dtype)
    with torch.no_grad():
        new.weight.copy_(1.0 + w)
    return new


def _open_gate(module):
    """A gate projection replaced by a constant 1e4: ``sigmoid(1e4) == 1`` exactly in
    every float type, so the gate it feeds passes the branch through unchanged."""
    import torch

    class OpenGate(torch.nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.width = width

        def forward(self, x):
            return torch.full((*x.shape[:-1], self.width), 1e4, dtype=x.dtype, device=x.device)

    return OpenGate(module.out_features)


def _identity_modules(family, model, layer_cfgs, paths_of, swap=None) -> int:
    """Replace the modules at ``paths_of(layer_cfg)`` in every decoder layer by the
    identity (or by ``swap(module)``); the number replaced."""
    import torch

    n = 0
    for i, layer in enumerate(family.decoder_layers(model)):
        if i >= len(layer_cfgs):
            break
        for path in paths_of(layer_cfgs[i]):
            parent, _, leaf = path.rpartition(".")
            try:
                owner = layer.get_submodule(parent) if parent else layer
            except AttributeError:
                continue
            mod = getattr(owner, leaf, None)
            # a module another switch of the same case already removed stays removed
            if isinstance(mod, torch.nn.Module) and not isinstance(mod, torch.nn.Identity):
                setattr(owner, leaf, torch.nn.Identity() if swap is None else swap(mod))
                n += 1
    return n


def rope_identity_overrides(config) -> dict | None:
    """Config overrides that make RoPE the identity (linear scaling, factor 1e30),
    keeping theta and the rotary width; per layer type where the family keys
    ``rope_parameters`` so. None if the config has no RoPE parameters."""
    rp = dict(getattr(config, "rope_parameters", None) or {})
    keep = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")

    def ident(p):
        return {"rope_type": "linear", "factor": 1e30, **{k: p[k] for k in keep if k in p}}

    if "rope_theta" in rp:
        return {"rope_parameters": ident(rp)}
    if rp and all(isinstance(v, dict) and "rope_theta" in v for v in rp.values()):
        return {"rope_parameters": {t: ident(p) for t, p in rp.items()}}
    return None


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _divisors(n: int) -> str:
    return ", ".join(map(str, divisors(n)))


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


def gguf_size_params(w, config, head_count_kv: bool = True) -> None:
    """The sizes conversion/base.py ``TextModel.set_gguf_parameters`` writes first
    (block count, context, embedding and feed-forward lengths, head counts), from
    the HF config's llama-style names; ``head_count_kv=False``: the caller writes
    its own (per-layer counts, MLA's MQA) or none."""
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    if head_count_kv:
        w.add_head_count_kv(config.num_key_value_heads)


YARN_KEYS = ("extrapolation_factor", "attention_factor", "beta_fast", "beta_slow")


def gguf_yarn_params(w, rp: dict, keys: tuple[str, ...] = YARN_KEYS) -> None:
    """conversion/base.py ``TextModel.set_gguf_parameters``, the YaRN arm: scaling
    type, factor, original context, then each of the optional ``keys`` of
    ``rope_parameters`` that is present -- written whether or not the arch reads
    it; HF's ``truncate`` has no GGUF key at all."""
    import gguf

    adders = {"extrapolation_factor": w.add_rope_scaling_yarn_ext_factor,
              "attention_factor": w.add_rope_scaling_yarn_attn_factor,
              "beta_fast": w.add_rope_scaling_yarn_beta_fast,
              "beta_slow": w.add_rope_scaling_yarn_beta_slow}
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    for key in keys:
        if rp.get(key) is not None:
            adders[key](rp[key])


def gguf_moe_convert(name: str, data: np.ndarray):
    """The converter's steps for transformers 5's MoE tensors, as ``(hf_style_name,
    array)`` pairs (None: not such a tensor):
    - conversion/base.py ``ModelBase.filter_tensors`` / ``modify_tensors``:
      ``e_score_correction_bias`` -> ``e_score_correction.bias`` (-> blk.N.exp_probs_b.bias);
    - ``mlp.experts.gate_up_proj``: transformers 5 fuses the experts into
      [E, 2F, H] (gate rows first); the converter reads the per-expert
      gate/up/down of a saved checkpoint and stacks them (``torch.stack(datas,
      dim=0)``) into ffn_{gate,up}_exps [E, F, H];
    - ``mlp.experts.down_proj`` [E, H, F] -> ffn_down_exps."""
    if name.endswith("e_score_correction_bias"):
        return [(name.replace("e_score_correction_bias", "e_score_correction.bias"), data)]
    if name.endswith("mlp.experts.gate_up_proj"):
        f = data.shape[-2] // 2
        base = name.removesuffix(".gate_up_proj")
        return [(base + ".gate_proj.weight", np.ascontiguousarray(data[..., :f, :])),
                (base + ".up_proj.weight", np.ascontiguousarray(data[..., f:, :]))]
    if name.endswith("mlp.experts.down_proj"):
        return [(name + ".weight", data)]
    return None


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
        gguf_yarn_params(w, rp)
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
        return rope_from_config(config, layer_type, layout=self.rope_layout, head_dim=head_dim)

    def layer_config(self, config, i: int) -> LayerConfig:
        """Layer ``i`` from the hooks above; a family adds what else it has with
        ``super().layer_config(config, i).replace(...)``."""
        hd = self.head_dim(config)
        eps = self.norm_eps(config)
        return LayerConfig(
            hidden_size=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads,
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
        layer = self.decoder_layers(model)[i]
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


def lc_unrotated(points: dict[str, LcPoint], q: str = "Qcur", k: str = "Kcur") -> dict[str, LcPoint]:
    """``points`` for a layer llama.cpp does not rotate: there is no ROPE node, so
    ``q_rope`` / ``k_rope`` are the last ``q`` / ``k`` tensors, the ones that enter
    the attention."""
    return {**points, "q_rope": LcPoint(q, "last", "heads"), "k_rope": LcPoint(k, "last", "heads")}


# llama.cpp's points of a layer with a fused QKV projection and no RoPE (bloom.cpp,
# mpt.cpp: ALiBi): q / k / v are the views build_qkv takes of the fused wqkv, and the
# same tensors enter kq; build_attn's wo product carries no name, so attn_out is not
# exposed
FUSED_QKV_NOPE_LC_POINTS = lc_unrotated({
    **{k: v for k, v in Family.lc_points.items() if k != "attn_out"},
    "q": LcPoint("Qcur", "last", "heads"),
    "k": LcPoint("Kcur", "last", "heads"),
})


@dataclass
class FamilyInfo:
    """What `conformance list` prints for a family."""

    name: str
    hf_model_type: str
    features: list[str] = field(default_factory=list)
    gguf_arch: str | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
