"""Which config keys the cases vary (issue 39): ``conformance coverage``.

The key table of a family is derived from the reference's own code, not written by
hand: every field its HF config class declares (what a checkpoint's config.json can
carry; the generic ones every ``PretrainedConfig`` has left out), the keys of its RoPE
table one level down (``rope_parameters.rope_theta``, ``rope_parameters.factor``, a
per-layer-type table as a whole), each marked with where transformers reads it -- the
modeling file (``config.X``, ``getattr(config, "X"``), the configuration file beyond the
field's own declaration (``__post_init__`` deriving ``layer_types`` from it), or
neither.

Against that table, what varies each key: a matrix case (every spec under
fixtures/matrix/, named with its spec and group: ``default`` runs in CI, the others on
their schedule) or the family's fuzz space (``Family.fuzz_space``, drawn), with the
values. A key nothing varies needs a written reason why it cannot change the attention
half (fixtures/coverage.toml: one for every family, or the family's own); a key neither
transformers file reads is reasoned by that fact. What is left is ``uncovered``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .config_values import field_types, global_value
from harness.lazy import lazy
from .matrix import load_spec
from .fuzz import case_strategy

transformers = lazy("transformers")
hypothesis = lazy("hypothesis")

ROOT = Path(__file__).resolve().parent.parent
REASONS = ROOT / "fixtures" / "coverage.toml"
SPECS = ROOT / "fixtures" / "matrix"
ROPE = "rope_parameters"
FUZZ_DRAWS = 200  # examples drawn from each family's fuzz space (derandomized: the same every run)


@dataclass
class Key:
    name: str
    read_by: list[str] = field(default_factory=list)  # the transformers files that read it
    default: object = None  # the family's tiny config's value
    varied: dict[str, set] = field(default_factory=dict)  # where -> the values it takes there
    reason: str | None = None
    ffn_only: list[str] = field(default_factory=list)  # the feed-forward classes that alone read it

    @property
    def status(self) -> str:
        if self.varied:
            return "varied"
        return "reasoned" if self.reason else "uncovered"


def _generic() -> set[str]:
    return set(field_types(transformers.PretrainedConfig)) | {"model_type", "transformers_version"}


def _source(module: str) -> str:
    try:
        return inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return ""


def _reads(src: str, key: str, own: bool = False) -> bool:
    """Whether ``src`` reads config key ``key`` (``config.key``, ``getattr(config, "key"``);
    ``own``: also as ``self.key`` -- the configuration class reading its own field."""
    k = re.escape(key)
    return bool(re.search(rf"config\.{k}\b|getattr\(\s*(?:self\.)?config\s*,\s*[\"']{k}[\"']"
                          + (rf"|\bself\.{k}\b" if own else ""), src))


# the modeling file's classes of the feed-forward half (after resid_mid): a key only they read
# cannot change the attention half
_FFN = re.compile(r"(MLP|Mlp|MoE|Moe|Experts?|Router|Gate|FeedForward|SharedExpert)$")


def _readers(mod, key: str) -> list[str]:
    """The classes and functions of the modeling module ``mod`` whose source reads ``key``."""
    out = []
    for name, obj in vars(mod).items():
        if getattr(obj, "__module__", None) != mod.__name__ or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        try:
            if _reads(inspect.getsource(obj), key):
                out.append(name)
        except (OSError, TypeError):
            continue
    return out


def hf_keys(fam) -> dict[str, Key]:
    """The family's key table on the HF side, read from transformers' sources."""
    cls = fam.config_class()
    generic = _generic()
    conf_mod = cls.__module__
    model_mod = conf_mod.replace(".configuration_", ".modeling_")
    model_src = _source(model_mod)
    # the configuration file without each field's own declaration line
    conf_src = "\n".join(ln for ln in _source(conf_mod).splitlines() if not re.match(r"\s+\w+\s*:\s*[^=]+(=|$)", ln))
    cfg = fam.make_config({})
    out: dict[str, Key] = {}
    for name in field_types(cls):
        if name in generic or name.startswith("_"):
            continue
        read = [f for f, src, own in ((model_mod.rpartition(".")[2] + ".py", model_src, False),
                                      (conf_mod.rpartition(".")[2] + ".py", conf_src, True)) if _reads(src, name, own)]
        # a per-layer key of a heterogeneous config (gemma4's head_dim): config.json's global value
        value = global_value(cfg, name, per_layer=vars(cfg).get(name))
        if name == ROPE and isinstance(value, dict):
            for k, v in value.items():
                out[f"{ROPE}.{k}"] = Key(f"{ROPE}.{k}", read, v)
            continue
        key = out[name] = Key(name, read, value)
        readers = _readers(importlib.import_module(model_mod), name) if model_src else []
        if readers and not read[1:] and all(_FFN.search(r) for r in readers):
            key.ffn_only = readers
    return out


def _add(keys: dict[str, Key], key: str, value, where: str, default) -> None:
    if isinstance(value, dict) and key == ROPE:
        for k, v in value.items():
            _add(keys, f"{ROPE}.{k}", v, where, default)
        return
    k = keys.get(key)
    if k is None:
        return
    if value == k.default:  # set to what the tiny config has already: nothing varied
        return
    k.varied.setdefault(where, set()).add(repr(value))


@functools.lru_cache(maxsize=None)
def _spec_cases() -> tuple:
    out = []
    for p in sorted(SPECS.glob("*.toml")):
        spec = load_spec(p, check=False)  # what it varies, whatever extras are installed here
        out += [(p.stem, c) for c in spec.cases]
    return tuple(out)


def _fuzz_draws(family: str) -> list[tuple]:
    got: list[tuple] = []

    @hypothesis.settings(max_examples=FUZZ_DRAWS, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(case_strategy([family]))
    def draw(case):
        got.append(case.overrides)

    draw()
    return got


@functools.lru_cache(maxsize=1)
def reasons() -> dict:
    try:
        return tomllib.loads(REASONS.read_text())
    except FileNotFoundError:
        return {}


def table(fam, fuzz: bool = True) -> dict[str, Key]:
    """``fam``'s key table with what varies each key and the reason for the rest."""
    keys = hf_keys(fam)
    for spec, case in _spec_cases():
        if case.family == fam.name:
            for key, value in case.overrides:
                _add(keys, key, value, spec, keys[key].default if key in keys else None)
    # the fuzz varies only what it runs: a family without a fuzz space of its own is not
    # fuzzed (harness/commands/fuzz.py), so its draws would vary nothing
    if fuzz and getattr(fam, "fuzz_space", None) is not None:
        for ov in _fuzz_draws(fam.name):
            for key, value in ov:
                _add(keys, key, value, "fuzz", keys[key].default if key in keys else None)
    r = reasons()
    own = r.get("families", {}).get(fam.name, {})
    common = r.get("all", {})
    for k in keys.values():
        if k.varied:
            continue
        k.reason = own.get(k.name) or common.get(k.name)
        if k.reason is None and not k.read_by:
            k.reason = ("read by neither the modeling file nor the configuration file beyond its declaration: "
                        "it cannot reach the forward")
        if k.reason is None and k.ffn_only:
            k.reason = (f"read only by the feed-forward half ({', '.join(k.ffn_only)}), after resid_mid: the attention "
                        "half does not read it (layer_out compares the feed-forward at the tiny config's value)")
    return keys


def summary(keys: dict[str, Key]) -> dict[str, int]:
    out = {"varied": 0, "reasoned": 0, "uncovered": 0}
    for k in keys.values():
        out[k.status] += 1
    return out


def open_drift(tabs: dict[str, dict[str, Key]], listed: dict[str, list[str]]) -> list[str]:
    """What differs between the tables and the list of keys known to be uncovered
    (fixtures/coverage_open.json): a key uncovered and not listed (a family gained a key
    nothing varies or reasons), or listed and no longer uncovered (varied or reasoned
    since: the list must shrink with it). One line each; empty when they agree."""
    out = []
    for name, keys in tabs.items():
        now = {k.name for k in keys.values() if k.status == "uncovered"}
        was = set(listed.get(name, ()))
        out += [f"{name}: {k} is varied by no case and reasoned nowhere (vary it in a matrix spec or the family's "
                f"fuzz_space, or say in fixtures/coverage.toml why it cannot change the attention half)"
                for k in sorted(now - was)]
        out += [f"{name}: {k} is covered now; drop it from fixtures/coverage_open.json "
                "(conformance coverage --update-open)" for k in sorted(was - now)]
    return out
