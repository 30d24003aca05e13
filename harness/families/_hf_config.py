"""A family's HF config mapping: which config keys a user may set (``--set``),
how a family's tiny config is built and checked before HF sees it, and the
shape checks HF itself does not make."""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib.metadata import version

from contract.layers import ConfigError, divisors

from ..errors import UsageError, suggest
from harness.lazy import lazy
from .. import config_values
from ..config_values import default_table, check_values, hf_refusals, refusal

configuration_auto = lazy("transformers.models.auto.configuration_auto")
transformers = lazy("transformers")

# Generic PretrainedConfig fields a user has no business setting through --set.
_GENERIC_FIELDS = {
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
    "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type",
    "use_cache", "initializer_range",
}


class HFConfig:
    """The config half of ``Family`` (mixed in; reads ``hf_model_type``, ``tiny``,
    ``size_keys``, ``variants`` and ``layer_configs`` of the family)."""

    # Config attributes the modeling code reads with getattr() although the config
    # class does not declare them (e.g. HF Qwen2Attention: getattr(config, "head_dim", ...)).
    extra_settable: tuple[str, ...] = ()
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

    def config_class(self):
        # the class itself, not type(an instance): HF's default Starcoder2Config
        # (vocab 49152, bos/eos 50256) warns "got 50256" each time it is built
        return _config_class(self.hf_model_type)

    def settable_keys(self) -> list[str]:
        return list(_settable_keys(self.config_class(), tuple(self.extra_settable)))

    def key_aliases(self) -> dict[str, str]:
        """The config class's own aliases (``PretrainedConfig.attribute_map``: GPT-2's
        ``hidden_size`` is ``n_embd``, MPT's is ``d_model``), so one ``--set`` /
        matrix override names the same size in every family."""
        amap = getattr(self.config_class(), "attribute_map", None) or {}
        valid = set(self.settable_keys())
        return {a: t for a, t in amap.items() if t in valid and a not in valid}

    def apply_overrides(self, d: dict, overrides: dict, table_default=None) -> dict:
        """``overrides`` (``--set`` keys; ``top.sub`` sets one key of the table
        ``top``) applied to the config dict ``d`` in place; a key the family does
        not offer is refused. ``table_default(top)``: the table a ``top.sub`` key
        starts from where ``d`` has none (default: an empty one)."""

        valid = self.settable_keys()
        aliases = self.key_aliases()
        tables = {}  # the family's own tables, before the overrides: what a dotted key is checked against
        for key, value in overrides.items():
            top, _, sub = key.partition(".")
            if top in aliases:  # the field the config class stores it in
                top = aliases[top]
                key = top + (f".{sub}" if sub else "")
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

        return self.apply_overrides(kw, overrides, lambda top: default_table(self.config_class(), top))

    def make_config(self, overrides: dict | None = None):
        kw = self.config_kwargs(overrides or {})
        return self.config_from_kwargs(kw, f"family {self.name}: the HF config refused these settings")

    def config_from_kwargs(self, kw: dict, refused: str):
        """The HF config from ``kw``, checked before (``validate``) and after
        (``validate_config``); ``refused`` starts the error where HF refuses it."""

        self.validate(kw)

        check_values(kw.items())

        try:
            config = transformers.AutoConfig.for_model(self.hf_model_type, **kw)
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



def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _divisors(n: int) -> str:
    return ", ".join(map(str, divisors(n)))



# Memoized per process: CONFIG_MAPPING's lazy lookup costs milliseconds a call (the
# transformers import structure is walked each time) and a matrix spec asks it for every
# case's config (harness/matrix.py _check_configs: ~2400 calls for the default spec, a
# quarter of the spec's load time). Both are pure functions of their arguments.
@functools.lru_cache(maxsize=None)
def _config_class(model_type: str):
    try:
        return configuration_auto.CONFIG_MAPPING[model_type]
    except KeyError:
        # an older transformers than the family was written for (`conformance upstream`
        # bisecting releases, or a user's own install): one line, not a KeyError

        raise UsageError(f"transformers {version('transformers')} has no model type {model_type!r} (a family "
                         "written for a newer release; the lock's is in lock.txt)") from None


@functools.lru_cache(maxsize=None)
def _settable_keys(cls, extra: tuple) -> tuple:
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(vars(cls()))
    names += list(extra)
    return tuple(sorted({n for n in names if n not in _GENERIC_FIELDS and not n.startswith("_")}))
