"""Config values a user sets (``--set``, a matrix spec's ``overrides``), checked
against what the HF config class declares, before any work.

- A whole number for a field HF declares ``float`` becomes that float: HF's
  config classes are huggingface_hub strict dataclasses
  (``huggingface_hub.dataclasses.strict``), whose ``_validate_simple_type``
  refuses ``30`` for ``attn_logit_softcapping: float | None``; ``--set
  attn_logit_softcapping=30`` means 30.0.
- A value that is not a finite number where the declared type is a number (an
  int or float field of the config class, or of ``RopeParameters`` for the keys
  of ``rope_parameters``) is refused, as are NaN and infinity anywhere.
- A dotted key ``table.sub`` must name a key the table accepts: for
  ``rope_parameters``, the keys transformers' own RoPE validation knows for the
  table's ``rope_type`` (``RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters``
  in transformers/modeling_rope_utils.py, read from HF rather than copied), and
  for any other table the keys the family's table holds.
- Whatever HF still refuses (its strict-dataclass validators, its own
  ValueErrors) is one line naming the key, the value and what is valid.
"""

from __future__ import annotations

import math
import re
import types
import typing
from typing import Any
import dataclasses
import copy
import logging
import json
from importlib import metadata

from .errors import UsageError, suggest
from harness.lazy import lazy
from . import cache
from .atomic import write_text

modeling_rope_utils = lazy("transformers.modeling_rope_utils")
hf_logging = lazy("transformers.utils.logging")
transformers = lazy("transformers")
huggingface_hub_errors = lazy("huggingface_hub.errors")

ROPE_TABLE = "rope_parameters"


def global_value(config, name: str, default=None, *, per_layer=None):
    """``getattr(config, name, default)``, or ``per_layer`` where the key is held per
    layer: transformers 5 refuses a global read of a key a heterogeneous config keeps
    in ``per_layer_config`` (gemma4's ``head_dim`` with a wider global head,
    ``num_key_value_heads`` with K = V: ``AmbiguousGlobalPerLayerAttributeError``, a
    RuntimeError, transformers/configuration_utils.py). Any other error is raised."""
    try:
        return getattr(config, name, default)
    except RuntimeError as e:
        if type(e).__name__ != "AmbiguousGlobalPerLayerAttributeError":
            raise
        return per_layer


# ---------------------------------------------------------------- declared types
def field_types(cls) -> dict[str, Any]:
    """``{field: declared type}`` of an HF config class (a dataclass in transformers
    5), as huggingface_hub's validator reads them: ``Field.type`` unevaluated (a
    string annotation is a forward reference it does not check; neither do we)."""

    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: f.type for f in dataclasses.fields(cls)}


def rope_types() -> dict[str, Any]:
    """``{key: declared type}`` of a RoPE table (transformers' ``RopeParameters``)."""
    return dict(modeling_rope_utils.RopeParameters.__annotations__)


def _members(tp) -> tuple:
    """The alternatives of a declared type: ``float | None`` -> (float, NoneType)."""
    if isinstance(tp, str) or tp is None:
        return ()
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(a for m in typing.get_args(tp) for a in (_members(m) or (m,)))
    return (tp,)


def _admits(tp, kind) -> bool:
    return any(m is kind or typing.get_origin(m) is kind for m in _members(tp))


def _number_only(tp) -> bool:
    """A declared type whose only non-None alternatives are int / float."""
    ms = [m for m in _members(tp) if m is not type(None)]
    return bool(ms) and all(m in (int, float) for m in ms)


def _describe(tp) -> str:
    ms = _members(tp)
    if not ms:
        return str(tp)
    names = [("null" if m is type(None) else getattr(m, "__name__", None) or str(m)) for m in ms]
    names = [n if n != "NoneType" else "null" for n in names]
    return " or ".join(dict.fromkeys(names))


def typed_value(key: str, value, tp):
    """``value`` as the declared type ``tp`` takes it; UsageError where it cannot be."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"config key {key!r} = {value!r}: expected a finite number")
    if tp is None:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and _admits(tp, float) and not _admits(tp, int):
        return float(value)
    if isinstance(value, list):
        inner = [typing.get_args(m)[0] for m in _members(tp) if typing.get_origin(m) is list and typing.get_args(m)]
        if inner:
            return [typed_value(f"{key}[{i}]", v, inner[0]) for i, v in enumerate(value)]
    if _number_only(tp) and value is not None and (isinstance(value, (str, bool, dict, list))):
        raise UsageError(f"config key {key!r} = {value!r}: expected {_describe(tp)}")
    return value


# ---------------------------------------------------------------- RoPE tables
class _Stop(Exception):
    pass


def rope_keys(cls, rope_type: str) -> set[str] | None:
    """The keys transformers' validation of ``rope_type`` knows (required and
    optional, plus ``partial_rotary_factor`` and the class's
    ``ignore_keys_at_rope_validation``, which ``_check_received_keys`` accepts
    for every type), or None for a type HF has no validator for. Read by running
    HF's own ``_validate_<type>_rope_parameters`` on a probe whose
    ``_check_received_keys`` records the sets it is handed and stops there."""
    fn = getattr(cls, f"_validate_{rope_type}_rope_parameters", None)
    if fn is None:
        return None
    seen: dict = {}

    class Probe:
        def _check_received_keys(self, rope_type, received_keys, required_keys, optional_keys=None, ignore_keys=None):
            seen["keys"] = set(required_keys) | set(optional_keys or ())
            raise _Stop

        def __getattr__(self, name):  # another validator it delegates to (axial -> default)
            attr = getattr(cls, name)
            return types.MethodType(attr, self) if isinstance(attr, types.FunctionType) else attr

    try:
        fn(Probe(), {"rope_type": rope_type}, ignore_keys=None)
    except _Stop:
        pass
    except Exception:  # noqa: BLE001 -- a validator shaped differently: no list to check against
        return None
    if "keys" not in seen:
        return None
    return seen["keys"] | {"partial_rotary_factor"} | set(getattr(cls, "ignore_keys_at_rope_validation", None) or ())


def known_rope_types(cls) -> list[str]:
    return sorted(m.group(1) for n in dir(cls) if (m := re.fullmatch(r"_validate_(\w+)_rope_parameters", n)))


def _check_rope(family: str, cls, where: str, params: dict, family_keys: set, set_keys: list[str]) -> None:
    rope_type = params.get("rope_type", params.get("type", "default"))
    known = rope_keys(cls, rope_type)
    if known is None:
        raise UsageError(f"{where}.rope_type {rope_type!r} is not a RoPE type transformers validates for family "
                         f"{family}; {suggest(rope_type, known_rope_types(cls))}")
    valid = known | family_keys | {"rope_type"}
    for sub in set_keys:
        if sub not in valid:
            raise UsageError(f"unknown key {where}.{sub} for rope_type {rope_type!r} of family {family}; "
                             f"{suggest(sub, sorted(valid))}")


def default_table(cls, top: str):
    """The config class's default value of the table ``top`` as a dict (a
    sub-config, like mpt's ``attn_config``, as its ``to_dict()``); a value that
    is not a table is returned as it is."""

    # the class's own defaults may not pass its own token-id check (Starcoder2Config:
    # vocab 49152, bos/eos 50256): what it says about them is not about this run
    logger = hf_logging.get_logger("transformers.configuration_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        v = getattr(_default_instance(cls), top, None)
    finally:
        logger.setLevel(level)
    if v is None:
        return {}
    return _as_table(v) if isinstance(v, dict) or hasattr(v, "to_dict") else copy.deepcopy(v)


_DEFAULTS: dict = {}


def _default_instance(cls):
    if cls not in _DEFAULTS:
        _DEFAULTS[cls] = cls()
    return _DEFAULTS[cls]


def _as_table(x) -> dict:
    """A dict, or a sub-config (mpt's ``attn_config``) as its own fields, without
    the generic ones every HF config has (``architectures``, ``dtype``, ...)."""
    if x is None:
        return {}
    if not hasattr(x, "to_dict"):
        return dict(x)

    generic = set(field_types(transformers.PretrainedConfig)) | {"model_type", "transformers_version"}
    return {k: v for k, v in x.to_dict().items() if k not in generic and not k.startswith("_")}


def check_tables(family, d: dict, overrides: dict, before: dict, table_default=None) -> None:
    """Every dotted override ``top.sub`` names a key its table accepts (checked
    after all overrides are in, so ``rope_parameters.rope_type=yarn`` may come
    after the yarn keys). The table a key is checked against: the family's
    (``before[top]``, before the overrides) over the config class's default
    (``table_default(top)``). The tables of a RoPE-per-layer-type config get
    their values typed here."""
    cls = family.config_class()
    defaults = {}
    for top in before:
        dflt = table_default(top) if table_default is not None else None
        defaults[top] = {**(dflt if isinstance(dflt, dict) else {}), **_as_table(before[top])}
    by_top: dict[str, list[str]] = {}
    for key in overrides:
        top, _, sub = key.partition(".")
        if sub:
            by_top.setdefault(top, []).append(sub)
    for top, subs in by_top.items():
        base = defaults.get(top) or {}
        table = d.get(top) or {}
        per_layer_type = bool(base) and all(isinstance(v, dict) or v is None for v in base.values())
        if top == ROPE_TABLE and not per_layer_type:
            _check_rope(family.name, cls, top, table, set(base), subs)
            continue
        for sub in subs:
            if base and sub not in base:
                what = "layer type" if top == ROPE_TABLE else "key"
                raise UsageError(f"unknown {what} {top}.{sub} for family {family.name}; {suggest(sub, sorted(base))}")
            if top != ROPE_TABLE:
                continue
            # RoPE per layer type (gemma3, mimo_v2_flash): each table set is a RoPE table of its own
            inner = table.get(sub)
            if not isinstance(inner, dict):
                raise UsageError(f"{top}.{sub} of family {family.name} is a RoPE table per layer type; set it as "
                                 f"{top}.{sub}='{{\"rope_type\": \"default\", \"rope_theta\": 10000.0}}'")
            for k, v in list(inner.items()):
                inner[k] = typed_value(f"{top}.{sub}.{k}", v, rope_types().get(k))
            _check_rope(family.name, cls, f"{top}.{sub}", inner, set(base.get(sub) or {}), list(inner))


def override_value(family, key: str, value):
    """One ``--set`` value as the config class declares its field (see the module doc)."""
    top, _, sub = key.partition(".")
    if sub:
        tp = rope_types().get(sub) if top == ROPE_TABLE else None
        return typed_value(key, value, tp)
    return typed_value(key, value, field_types(family.config_class()).get(top))


# ---------------------------------------------------------------- HF's refusals
def hf_refusals() -> tuple[type, ...]:
    """The exceptions an HF config constructor raises for a bad value."""
    return (ValueError, TypeError, KeyError, huggingface_hub_errors.StrictDataclassError)


def refusal(e: Exception, family, kw: dict, prefix: str) -> UsageError:
    """One line for HF's refusal of ``kw``: the key, the value, what is valid."""
    msg = str(e)
    m = re.match(r"Validation error for field '([^']+)'", msg)
    if m:
        name = m.group(1)
        tp = field_types(family.config_class()).get(name)
        valid = f"expected {_describe(tp)}" if tp is not None else " ".join(msg.split("\n", 1)[-1].split())
        return UsageError(f"{prefix}: config key {name!r} = {kw.get(name)!r}: {valid}")
    return UsageError(f"{prefix}: {' '.join(msg.split())[:400]}")


# ---------------------------------------------------------------- values the arithmetic cannot take
# Settings every side would turn into NaN / inf (or a division by zero) before any
# comparison: refused as bad input, naming the field and what is valid (issue 29,
# finding 5: --set rope_parameters.rope_theta=-5 ran and blamed 18 failures on the
# candidate). Matched on a leaf key's name, at any depth (a RoPE table per layer type).
# (pattern, what is valid, why -- the reference arithmetic that breaks)
_POSITIVE = (
    (r"rope_theta|.*_base_freq|rope_local_base_freq|theta",
     "RoPE's base: inv_freq = theta ** (-2i/d) (HF modeling_rope_utils _compute_default_rope_parameters, "
     "ggml_rope's theta_scale) is NaN for theta <= 0"),
    (r".*(_|^)eps|.*epsilon",
     "a norm's epsilon: x / sqrt(mean(x^2) + eps) is inf / NaN on a zero row without it"),
    (r"factor|attention_factor|original_max_position_embeddings|max_position_embeddings",
     "a RoPE scaling length or factor: HF divides by it (_compute_linear / _yarn / _llama3_parameters)"),
    (r"query_pre_attn_scalar", "the attention scale is query_pre_attn_scalar ** -0.5"),
    (r"beta_fast|beta_slow", "YaRN's ramp bounds are log() arguments (_yarn_find_correction_dim)"),
    (r"low_freq_factor|high_freq_factor", "llama3's smoothing divides by wavelengths of these factors"),
    (r".*softcap.*|.*softcapping", "a softcap divides by its cap: cap * tanh(x / cap); unset it (null) for none"),
    # (the head and layer counts are the family's own shape check: HFConfig.validate)
    (r"vocab_size|intermediate_size|sliding_window|attention_chunk_size|kv_lora_rank|q_lora_rank|v_head_dim",
     "a size; null where the family takes none"),
)
_UNIT = ((r"partial_rotary_factor", "the fraction of each head RoPE rotates"),)


def _walk(key: str, value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(f"{key}.{k}" if key else str(k), v)
    else:
        yield key, value


def check_values(items) -> None:
    """UsageError (one line, exit 2) for a setting the references would turn into
    non-finite numbers: ``items`` are ``(key, value)`` pairs (``--set`` overrides, a
    config's keyword arguments; tables walked to their leaves). Runs before any
    config class is imported."""
    for top, value in items:
        for key, v in _walk(str(top), value):
            leaf = key.rsplit(".", 1)[-1]
            if v is None or isinstance(v, (bool, str, list)):
                continue
            if isinstance(v, float) and not math.isfinite(v):
                raise UsageError(f"config key {key!r} = {v!r}: expected a finite number")
            if not isinstance(v, (int, float)):
                continue
            for pat, why in _POSITIVE:
                if re.fullmatch(pat, leaf) and v <= 0:
                    # a zero softcap of HF's means none (modeling code tests `is not None`, the GGUF
                    # writer and spec a positive cap): null is the way to say none
                    raise UsageError(f"config key {key!r} = {v!r}: must be a positive number ({why})")
            for pat, why in _UNIT:
                if re.fullmatch(pat, leaf) and not 0 < v <= 1:
                    raise UsageError(f"config key {key!r} = {v!r}: must be in (0, 1] ({why})")
        if isinstance(value, dict):
            lo, hi = value.get("low_freq_factor"), value.get("high_freq_factor")
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi <= lo:
                raise UsageError(f"config key {top!r}: high_freq_factor {hi!r} must exceed low_freq_factor {lo!r} "
                                 "(llama3 RoPE divides by their difference: _compute_llama3_parameters)")


# ---------------------------------------------------------------- the fast path
# A bad --set refused without importing transformers (issue 29, finding 4: 4-10 s to
# refuse one): what the config class declares -- the settable keys and, per key, what
# typed_value checks -- is read once from HF and kept in the cache, keyed by the
# transformers version and the source of the family and of this module.
def _type_info(tp) -> dict:
    inner = [typing.get_args(m)[0] for m in _members(tp) if typing.get_origin(m) is list and typing.get_args(m)]
    return {"number_only": _number_only(tp), "describe": _describe(tp),
            "list": _type_info(inner[0]) if inner else None}


def schema(family) -> dict:
    """``{"settable": [...], "types": {key: info}, "rope": {key: info}}`` of the
    family's config class (the cache's copy when it has one)."""

    try:
        tf = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        tf = "?"
    k = cache.key("config-schema", family.name, tf, cache.source_hash(__file__, *cache.family_sources(family)))
    path = cache.cache_dir() / "config-schema" / f"{family.name}-{k}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    types = field_types(family.config_class())
    out = {"settable": family.settable_keys(), "aliases": family.key_aliases(),
           "types": {n: _type_info(t) for n, t in types.items()},
           "rope": {n: _type_info(t) for n, t in rope_types().items()}}

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(out))
    return out


def _check_typed(key: str, value, info: dict | None) -> None:
    """What ``typed_value`` refuses, from a schema entry."""
    if info is None or value is None:
        return
    if isinstance(value, list) and info.get("list"):
        for i, v in enumerate(value):
            _check_typed(f"{key}[{i}]", v, info["list"])
        return
    if info["number_only"] and isinstance(value, (str, bool, dict, list)):
        raise UsageError(f"config key {key!r} = {value!r}: expected {info['describe']}")


def check_overrides(family, overrides) -> None:
    """The --set keys and value types, refused as ``apply_overrides`` refuses them
    (same words), from the cached schema: before any config class is imported."""
    sch = schema(family)
    valid = sch["settable"]
    aliases = sch.get("aliases", {})
    for key, value in overrides:
        top, _, sub = key.partition(".")
        top = aliases.get(top, top)
        if top not in valid:
            raise UsageError(f"unknown config key {key!r} for family {family.name}; {suggest(top, valid)}")
        if sub:
            _check_typed(key, value, sch["rope"].get(sub) if top == ROPE_TABLE else None)
        else:
            _check_typed(key, value, sch["types"].get(top))
