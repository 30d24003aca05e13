"""Reading a family's GGUF back (``--gguf``): the reverse of the export, hook
for hook (harness/refs/gguf_import.py drives it), and the reverse steps every
llama-shaped family shares (TextModel's generic keys, gguf's tensor-name map
run backwards)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UsageError

# general.* and tokenizer.* say nothing about the arithmetic: the harness feeds
# token ids, never text. Every other key belongs to the arch and must be read.
_NEUTRAL_PREFIXES = ("general.", "tokenizer.", "split.", "GGUF.")
_REQUIRED = object()


class GGUFMeta:
    """A GGUF's metadata, read key by key: ``get("attention.head_count")`` reads
    ``{arch}.attention.head_count`` (a key starting ``general.`` / ``tokenizer.``
    is taken as is). Every read is recorded, so the importer can refuse the
    arch keys nobody understood."""

    def __init__(self, arch: str, values: dict[str, Any], path: str = ""):
        self.arch = arch
        self.values = values
        self.path = path
        self.read: set[str] = set()

    def full(self, key: str) -> str:
        return key if key.startswith(_NEUTRAL_PREFIXES) else f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self.full(key) in self.values

    def get(self, key: str, default=_REQUIRED):
        k = self.full(key)
        self.read.add(k)
        if k not in self.values:
            if default is _REQUIRED:
                raise UsageError(f"--gguf {self.path}: metadata key {k!r} is missing")
            return default
        return self.values[k]

    def unread(self) -> list[str]:
        return sorted(k for k in self.values if not k.startswith(_NEUTRAL_PREFIXES) and k not in self.read)


class GGUFImport:
    """The GGUF-import half of ``Family`` (mixed in)."""

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
        # the mixins (this one, GGUFExport, ...) all count as Family itself
        mro = [c for c in type(self).__mro__ if not c.__module__.startswith(__package__ + "._")]

        def depth(name):
            return next(i for i, c in enumerate(mro) if name in vars(c) or c.__name__ == "Family")

        for fwd, rev in self._GGUF_REVERSE:
            if depth(rev) > depth(fwd):
                return (f"its export overrides {fwd} and no reverse {rev} is written yet "
                        f"(harness/families/_gguf_import.py)")
        return None

    def config_from_gguf(self, meta, shapes: dict[str, tuple]) -> dict:
        """HF config kwargs from a GGUF's metadata, the reverse of ``gguf_params``.
        ``meta.get("attention.head_count")`` reads ``{arch}.attention.head_count``
        (and records the read: an arch key no reverse reads is refused);
        ``shapes``: GGUF tensor name -> shape in HF order. A family extends this
        (calling super) for the keys its ``gguf_params`` adds."""
        return text_config_from_gguf(self, meta, shapes)

    def gguf_untransform(self, name: str, data: np.ndarray, config) -> np.ndarray:
        """The inverse of ``gguf_transform`` for HF tensor ``name`` (default: none)."""
        return data

    def gguf_import_tensors(self, tensors: dict, model, config) -> dict[str, np.ndarray]:
        """The HF state dict of ``model`` from the GGUF's tensors (gguf name -> a
        callable giving float32 numpy): gguf's tensor-name map run backwards,
        then ``gguf_untransform``. Every HF tensor must be found, every GGUF
        tensor used."""
        return import_by_name_map(self, tensors, model, config)


def float32_value(v) -> float:
    """A float the file holds as float32, as the shortest decimal that is that
    float32 (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(v)))


def text_config_from_gguf(family, meta: GGUFMeta, shapes: dict[str, tuple]) -> dict:
    """HF config kwargs from the keys ``Family.gguf_params`` writes (the keys
    conversion/base.py ``TextModel.set_gguf_parameters`` and conversion/llama.py
    ``LlamaModel.set_gguf_parameters`` write), read back one by one. Defaults
    are llama.cpp's own where a key is optional (src/llama-model.cpp
    ``load_hparams``: ``head_count_kv`` = ``head_count``, ``rope.freq_base`` =
    10000)."""
    import dataclasses

    cls = family.config_class()
    cfields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(vars(cls()))
    kw: dict[str, Any] = {}
    kw["num_hidden_layers"] = int(meta.get("block_count"))
    kw["max_position_embeddings"] = int(meta.get("context_length"))
    hidden = kw["hidden_size"] = int(meta.get("embedding_length"))
    kw["intermediate_size"] = int(meta.get("feed_forward_length"))
    nh = kw["num_attention_heads"] = _scalar(meta, "attention.head_count")
    kw["num_key_value_heads"] = _scalar(meta, "attention.head_count_kv", nh)
    kw["rms_norm_eps"] = float32_value(meta.get("attention.layer_norm_rms_epsilon"))

    hd = meta.get("attention.key_length", None)
    vd = meta.get("attention.value_length", hd)
    if vd != hd:
        raise UsageError(f"--gguf {meta.path}: key_length {hd} != value_length {vd}; family {family.name} has one head_dim")
    head_dim = int(hd) if hd is not None else hidden // nh
    if hd is not None and ("head_dim" in cfields or head_dim != hidden // nh):
        kw["head_dim"] = head_dim  # HF *Attention: getattr(config, "head_dim", hidden // heads)
    rot = meta.get("rope.dimension_count", None)
    if rot is not None and int(rot) != head_dim:
        raise UsageError(f"--gguf {meta.path}: rope.dimension_count {rot} != head_dim {head_dim} (partial rotary); "
                         f"family {family.name}'s reverse mapping has full rotary only")

    if "token_embd.weight" not in shapes:
        raise UsageError(f"--gguf {meta.path}: no token_embd.weight tensor")
    vocab = shapes["token_embd.weight"][0]
    declared = meta.get("vocab_size", None)
    if declared is not None and int(declared) != vocab:
        raise UsageError(f"--gguf {meta.path}: vocab_size {declared} != token_embd rows {vocab}")
    kw["vocab_size"] = int(vocab)

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float32_value(meta.get("rope.freq_base", 10000.0))}
    kind = meta.get("rope.scaling.type", "none")
    meta.get("rope.scaling.finetuned", None)  # read, no effect: llama.cpp keeps it as hparams.rope_finetuned only
    if kind == "linear":
        rope.update(rope_type="linear", factor=float32_value(meta.get("rope.scaling.factor")))
    elif kind == "yarn":
        rope.update(rope_type="yarn", factor=float32_value(meta.get("rope.scaling.factor")),
                    original_max_position_embeddings=int(meta.get("rope.scaling.original_context_length")))
        for key, hf in (("rope.scaling.yarn_ext_factor", "extrapolation_factor"),
                        ("rope.scaling.yarn_attn_factor", "attention_factor"),
                        ("rope.scaling.yarn_beta_fast", "beta_fast"),
                        ("rope.scaling.yarn_beta_slow", "beta_slow")):
            v = meta.get(key, None)
            if v is not None:
                rope[hf] = float32_value(v)
    elif kind != "none":
        raise UsageError(f"--gguf {meta.path}: rope scaling {kind!r} has no reverse mapping for family {family.name}")
    kw["rope_parameters"] = rope

    # The converter writes output.weight only for an untied head
    # (conversion/base.py: tied embeddings have no separate lm_head tensor).
    kw["tie_word_embeddings"] = "output.weight" not in shapes
    # Special token ids: the file's own (tokenizer.ggml.*), else none -- HF's
    # defaults (e.g. pad 128004) may lie outside the file's vocabulary. They
    # shape no arithmetic: the harness feeds token ids.
    for hf, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("pad_token_id", "padding_token_id")):
        v = meta.get(f"tokenizer.ggml.{key}", None)
        kw[hf] = int(v) if v is not None and 0 <= int(v) < vocab else None
    # Bias switches HF keeps in the config (HF LlamaAttention: bias=config.attention_bias
    # on q/k/v/o; LlamaMLP: bias=config.mlp_bias): on when the file carries them.
    if "attention_bias" in cfields:
        kw["attention_bias"] = "blk.0.attn_q.bias" in shapes
    if "mlp_bias" in cfields:
        kw["mlp_bias"] = "blk.0.ffn_up.bias" in shapes
    return kw


def _scalar(meta: GGUFMeta, key: str, default=_REQUIRED):
    v = meta.get(key, default)
    if isinstance(v, (list, tuple)):  # per-layer arrays: one value only
        if len(set(v)) != 1:
            raise UsageError(f"--gguf {meta.path}: per-layer {key} {list(v)} has no reverse mapping")
        v = v[0]
    return int(v)


def import_by_name_map(family, tensors: dict[str, Any], model, config) -> dict[str, np.ndarray]:
    """The HF state dict from the GGUF's tensors: every HF name of ``model``
    through gguf's own tensor-name map (``get_tensor_name_map``, as the export
    and the converter's ``map_tensor_name`` use it), its tensor dequantized and
    untransformed. ``tensors``: gguf name -> a callable returning float32 numpy."""
    tmap = family.gguf_tensor_map(config)
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()
    sd = model.state_dict()
    emb = getattr(model.get_input_embeddings(), "weight", None)
    embed_ptr = None if emb is None else emb.data_ptr()
    for name, p in sd.items():
        g = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if g is None:
            raise UsageError(f"--gguf: family {family.name}: HF tensor {name!r} has no GGUF name")
        if g not in tensors:
            if getattr(config, "tie_word_embeddings", False) and p.data_ptr() == embed_ptr:
                continue  # the tied head: the same tensor as token_embd, loaded under its own name
            raise UsageError(f"--gguf: the file has no {g!r} (HF {name}) for family {family.name}")
        data = family.gguf_untransform(name, tensors[g](), config)
        if tuple(data.shape) != tuple(p.shape):
            raise UsageError(f"--gguf: tensor {g!r} has shape {tuple(data.shape)}, "
                             f"family {family.name} expects {tuple(p.shape)} for HF {name}")
        out[name] = data
        used.add(g)
    left = sorted(set(tensors) - used)
    if left:
        raise UsageError(f"--gguf: tensors with no counterpart in family {family.name}'s HF model: "
                         f"{', '.join(left[:6])}{' ...' if len(left) > 6 else ''}")
    return out
