"""Reading a user's GGUF (``--gguf PATH``): the reverse of the export.

For a user who has only a GGUF -- written by llama.cpp's own converter
(``convert_hf_to_gguf.py``) or anything else that follows it -- this module
rebuilds what the harness otherwise builds itself:

1. the family, from ``general.architecture`` (the family whose ``gguf_arch``
   it is; several: the one NAMED like the arch, or ``--family``);
2. an HF config, from the metadata (``Family.config_from_gguf``, the reverse
   of ``Family.gguf_params``). Every ``{arch}.*`` key must be understood: a key
   the family's reverse did not read is refused, never ignored -- it may change
   what llama.cpp computes (a window, a softcap, experts);
3. the HF state dict, from the tensors (``Family.gguf_import_tensors``: the
   gguf tensor-name map run backwards over the HF names of a model built from
   that config, each tensor dequantized and passed through
   ``Family.gguf_untransform``, the inverse of ``gguf_transform`` -- llama:
   the converter's Q/K row permutation). Every HF tensor must be found and
   every GGUF tensor used (``rope_freqs``, experts, ... are refused);
4. an HF model holding those weights, and from it impl's weights through the
   family's ordinary ``layer_weights`` -- the same code as always.

Weights: F32, F16, BF16 and Q8_0 (``gguf.quants.dequantize``; all four are
exact in float32). The case is judged at the coarsest type among the file's
matrices (the file decides; ``--gguf-type`` does not apply to a file the user
brings). Other quantizations are refused: the tolerance policy has no entry
for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError, suggest

# gguf tensor type -> the weight-type name the case and the policy use
WEIGHT_TYPE_NAMES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
_COARSENESS = {"f32": 0, "f16": 1, "bf16": 1, "q8_0": 2}
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


@dataclass
class GGUFSource:
    """What ``harness.case.CaseRun`` takes from a user's GGUF."""

    path: str
    family: Any
    config: Any
    model: Any  # the float32 HF model holding the file's (dequantized) weights
    layer_weights: list[dict]
    weight_type: str  # the coarsest of the file's matrix types: f32 / f16 / bf16 / q8_0
    tensor_types: dict[str, str] = field(default_factory=dict)


def read_fields(reader) -> dict[str, Any]:
    out = {}
    for k, f in reader.fields.items():
        try:
            out[k] = f.contents()
        except Exception:  # a field this gguf version cannot decode: keep its presence
            out[k] = None
    return out


def importable_archs() -> dict[str, list[str]]:
    """arch -> the families that can read it."""
    from .. import families

    out: dict[str, list[str]] = {}
    for name, fam in families.registry().items():
        if fam.gguf_arch and fam.gguf_import_unsupported() is None:
            out.setdefault(fam.gguf_arch, []).append(name)
    return out


def pick_family(arch: str, family: str | None, path: str = ""):
    from .. import families

    reg = families.registry()
    if family:
        fam = families.get(family)
        if fam.gguf_arch != arch:
            raise UsageError(f"--gguf {path}: the file's architecture is {arch!r}, family {fam.name} reads "
                             f"{fam.gguf_arch or 'no GGUF'}")
    else:
        cands = [f for f in reg.values() if f.gguf_arch == arch]
        if not cands:
            ok = importable_archs()
            raise UsageError(f"--gguf {path}: unknown GGUF architecture {arch!r}; {suggest(arch, sorted(ok))}")
        named = [f for f in cands if f.name == arch]
        if named:
            fam = named[0]
        elif len(cands) == 1:
            fam = cands[0]
        else:
            raise UsageError(f"--gguf {path}: architecture {arch!r} is read by families "
                             f"{', '.join(f.name for f in cands)}; choose one with --family")
    why = fam.gguf_import_unsupported()
    if why:
        raise UsageError(f"--gguf is not supported for family {fam.name}: {why}")
    return fam


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


def load(path: str, family: str | None = None) -> GGUFSource:
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as e:  # not a GGUF / truncated: the reader raises ValueError, struct errors, ...
        raise UsageError(f"--gguf {path}: not a readable GGUF file ({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None
    values = read_fields(reader)
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise UsageError(f"--gguf {path}: no general.architecture")
    fam = pick_family(arch, family, path)

    infos = {t.name: t for t in reader.tensors}
    types = {n: t.tensor_type.name for n, t in infos.items()}
    odd = sorted({ty for ty in types.values() if ty not in WEIGHT_TYPE_NAMES})
    if odd:
        raise UsageError(f"--gguf {path}: tensor types {', '.join(odd)} are not read; valid: "
                         f"{', '.join(WEIGHT_TYPE_NAMES)} (the types the tolerance policy knows)")
    shapes = {n: tuple(int(d) for d in reversed(t.shape.tolist())) for n, t in infos.items()}
    meta = GGUFMeta(arch, values, path)
    kw = fam.config_from_gguf(meta, shapes)
    left = meta.unread()
    if left:
        raise UsageError(f"--gguf {path}: metadata keys family {fam.name}'s reverse mapping does not read "
                         f"(each may change what llama.cpp computes): {', '.join(left[:6])}")
    config = fam.config_from_kwargs(kw, f"--gguf {path}: the HF config refused the file's settings")

    def loader(info):
        def get():
            a = gguf.quants.dequantize(info.data, info.tensor_type)
            return np.array(a, dtype=np.float32).reshape(tuple(int(d) for d in reversed(info.shape.tolist())))
        return get

    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    except (ValueError, TypeError, KeyError, AssertionError, RuntimeError) as e:
        raise UsageError(f"--gguf {path}: HF cannot build family {fam.name} from the file's config: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    state = fam.gguf_import_tensors({n: loader(t) for n, t in infos.items()}, model, config)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    # a tied head shares token_embd's storage: loaded with it, "missing" by name only
    emb = getattr(model.get_input_embeddings(), "weight", None)
    sd = model.state_dict()
    tied = {k for k in missing if emb is not None and k in sd and sd[k].data_ptr() == emb.data_ptr()}
    if set(missing) - tied or unexpected:
        raise UsageError(f"--gguf {path}: the weights do not fit family {fam.name}'s HF model "
                         f"(missing {sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]})")
    layer_cfgs = fam.layer_configs(config, fam.variants[0] if fam.variants else None)
    from ..families.base import NotInImpl

    lw = [{} if isinstance(lc, NotInImpl) else fam.layer_weights(model, config, i) for i, lc in enumerate(layer_cfgs)]
    mats = [WEIGHT_TYPE_NAMES[types[n]] for n in infos if len(shapes[n]) >= 2]
    wt = max(mats or ["f32"], key=lambda t: _COARSENESS[t])
    return GGUFSource(str(p), fam, config, model, lw, wt, types)
