"""The warm path of one case (issue 29, finding 4): a case whose every capture is
cached runs without building an HF config or a torch model -- without importing
transformers or torch at all on impl's NumPy backend.

What the model stage (``harness/pipeline/build.py``) would compute from the HF
config and the seeded model is stored with the captures, as a *record*, the
first time the case runs the full (cold) way: a snapshot of the config's values
(``ConfigSnapshot``: what findings match on and the memory estimate reads), the
layer descriptions, the token ids, impl's weights of every layer it was given
(float64 NumPy, exactly as the family's ``layer_weights`` made them), the
parameter counts (``budget.param_counts``: a meta-device model otherwise), and
where each reference capture the case read lies in the cache.

The record is content-addressed like the captures (harness/cache.py): its key
hashes the whole case, the source of every module of ``harness``, ``contract``
and ``impl`` and of the family's own files, pyproject.toml (the plug-ins), the
installed references, and the versions of everything that computes a result
(NumPy, torch, transformers, llama-cpp-python and its kernels, gguf). Any change
to any of them -- a ``--set``, a seed, a family's code, transformers -- is
another key: the record is not found and the case takes the cold path (and
writes the new record). A record whose captures are gone from the cache is not
used either. What depends on the machine is not recorded: the memory plan is
made again from the snapshot (harness/budget.py), and a run whose plan asks for
a capture the record does not hold (``Miss``) starts again the cold way.

Only cases the record can reproduce take it (``eligible``): the seeded model (no
``--gguf`` / ``--hf-model`` file, no ``--prompt``, no ``switch_off``, float
weights) and a candidate that reads nothing of the case beyond what a
``LayerCall`` holds (``Candidate.warm_path``: impl's own body). It is written
only after a run in which every capture came from the cache without an error,
and only for a model small enough to hold its weights twice (``MAX_PARAMS``).
The record is a pickle in the user's own cache directory, trusted as the rest
of that directory is.
"""

from __future__ import annotations

import pickle
import platform
from functools import lru_cache
from pathlib import Path
import json

from . import cache
from .versions import ROOT, _version, llama_cpp_kernels
from .ggml_types import is_quantized
from .store import ProbeStore
from . import atomic
from .references import RefCapture

SCHEMA = 1  # bump when what a record holds, or what it means, changes
KIND = "warm"
MAX_PARAMS = 8_000_000  # float64 weights of at most 64 MB held by the recorder (tiny configs: ~10^5)
# the packages whose versions shape a stored result (harness/versions.py PACKAGES, less pandas: a view)
PACKAGES = ("numpy", "torch", "transformers", "llama_cpp_python", "gguf", "array_api_compat", "kernels")
_TREES = ("harness", "contract", "impl")


class Miss(BaseException):
    """The warm run needed something its record does not hold: run the case cold
    (``CaseRun.rows``). A BaseException, so no stage's ``except Exception`` turns it
    into an error capture or an error row of the candidate."""


# ---------------------------------------------------------------- the key
def _tree_files() -> list[Path]:
    """Every module of the project's three packages, and pyproject.toml (the plug-ins)."""
    files = sorted(p for t in _TREES for p in (ROOT / t).rglob("*.py"))
    return [f for f in (*files, ROOT / "pyproject.toml") if f.is_file()]


@lru_cache(maxsize=1)
def _tree_hash() -> str:
    return cache.source_hash(*_tree_files())


@lru_cache(maxsize=1)
def _versions() -> dict:
    v = {p: _version(p) for p in PACKAGES}
    v["python"] = platform.python_version()
    v["llama_cpp_kernels"] = llama_cpp_kernels()  # they key every llama.cpp capture
    return v


def key(case, family, reference_names) -> str:
    """The record's key: everything the recorded objects depend on (module docstring)."""
    return cache.key(KIND, SCHEMA, case.to_dict(), family.name, _tree_hash(),
                     cache.source_hash(*cache.family_sources(family)), list(reference_names), _versions())


def eligible(case, candidate) -> bool:
    """Whether the record of ``case`` can stand in for its model stage (module docstring)."""
    return (not case.gguf and not case.hf_model and case.prompt is None and not case.switch_off
            and not is_quantized(case.gguf_type) and getattr(candidate, "warm_path", False))


# ---------------------------------------------------------------- the config
class Opaque:
    """A config value that is not plain data (a ``torch.dtype``): set, equal to nothing."""
    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"Opaque({self.text})"


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if hasattr(v, "to_json_string") and hasattr(v, "to_dict"):  # a sub-config (text_config)
        return ConfigSnapshot.of(v)
    return Opaque(repr(v))


class ConfigSnapshot:
    """An HF config's values, read as attributes as the config's own are (what
    ``policy.config_value`` and ``budget.estimate`` read): every key of
    ``to_dict()``, every public attribute, every alias of ``attribute_map`` and every
    property of the class, as the config returned them -- tuples stay tuples, a
    sub-config is a snapshot. ``to_json_string`` is the config's own text (the
    parameter counts' cache key, harness/budget.py)."""

    def __init__(self, values: dict, json_text: str, counts=None):
        self.__dict__["_values"] = values
        self.__dict__["_json"] = json_text
        self.__dict__["counts"] = counts  # budget.ParamCounts of the model (the top-level config only)

    @classmethod
    def of(cls, config, counts=None) -> "ConfigSnapshot":
        names = set(config.to_dict()) | {n for n in vars(config) if not n.startswith("_")}
        names |= set(getattr(config, "attribute_map", {}) or {})
        names |= {n for k in type(config).__mro__ for n, v in vars(k).items()
                  if isinstance(v, property) and not n.startswith("_")}
        values = {}
        for n in sorted(names):
            try:
                values[n] = _plain(getattr(config, n))
            except Exception:  # noqa: BLE001 -- a property that raises is absent, as getattr finds it
                continue
        return cls(values, config.to_json_string(use_diff=False), counts)

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("a recorded config is read-only")

    def to_json_string(self, use_diff: bool = False) -> str:
        if use_diff:
            raise Miss("a recorded config has no diff form")
        return self._json

    def to_dict(self) -> dict:
        return json.loads(self._json)

    def __reduce__(self):
        return (ConfigSnapshot, (self._values, self._json, self.counts))


# ---------------------------------------------------------------- the record
def _call_key(name: str, kw: dict) -> str:
    """One reference capture call by its arguments (``force``: the capture it is fed by, by key)."""
    plain = {k: (v.key if k == "force" and v is not None else sorted(v.items()) if isinstance(v, dict) else v)
             for k, v in kw.items()}
    return cache.key(name, sorted(plain.items()))


class Recorder:
    """What a cold run's model stage hands out, kept to be written as the record."""
    def __init__(self, k: str):
        self.key = k
        self.ok = True
        self.captures: dict[str, dict] = {}
        self.weights: dict[tuple[str, int], dict] = {}

    def capture(self, name: str, kw: dict, rc) -> None:
        path = getattr(rc.probes, "path", None)
        root = cache.cache_dir().resolve()
        if (rc.error or not isinstance(rc.probes, ProbeStore) or rc.meta.get("uncached") or path is None
                or root not in Path(path).resolve().parents):
            self.ok = False  # an error, or a capture held outside the cache: nothing to replay
            return
        self.captures[_call_key(name, kw)] = {"name": rc.name, "dtype": rc.dtype, "key": rc.key,
                                              "path": str(Path(path).resolve().relative_to(root))}

    def add_weights(self, dtype: str, i: int, w: dict, n_params: int) -> None:
        """Layer ``i``'s impl weights as handed out (a copy: the caller's may change)."""
        if n_params > MAX_PARAMS:
            self.ok = False  # a real-size model: its weights are not held twice, nor written
            return
        self.weights[(dtype, i)] = {k: v.copy() if hasattr(v, "copy") else v for k, v in w.items()}

    def write(self, config, counts, layer_cfgs, tokens) -> None:
        if not self.ok or counts is None or counts.total > MAX_PARAMS:
            return

        record = {"schema": SCHEMA, "config": ConfigSnapshot.of(config, counts), "layer_cfgs": list(layer_cfgs),
                  "tokens": tokens, "weights": self.weights, "captures": self.captures}
        atomic.write_bytes(cache.cache_dir() / KIND / f"{self.key}.pkl", pickle.dumps(record, protocol=5))


class Record:
    """A record read back: what the warm run's model stage serves."""
    def __init__(self, data: dict):
        self.config = data["config"]
        self.layer_cfgs = data["layer_cfgs"]
        self.tokens = data["tokens"]
        self.weights = data["weights"]
        self.captures = data["captures"]

    def layer_weights(self, dtype: str, i: int) -> dict:
        if (dtype, i) not in self.weights:
            raise Miss(f"layer {i}'s weights in {dtype}")
        return {k: v.copy() if hasattr(v, "copy") else v for k, v in self.weights[(dtype, i)].items()}

    def capture(self, name: str, kw: dict):
        c = self.captures.get(_call_key(name, kw))
        if c is None:
            raise Miss(f"capture {name} {sorted(kw)}")
        st = ProbeStore(cache.cache_dir() / c["path"])
        if not (st.path / "meta.json").is_file():  # removed since the record was checked
            raise Miss(f"capture {c['path']}")
        return RefCapture(c["name"], c["dtype"], st, meta=st.meta, cached=True, key=c["key"])


def load(k: str) -> Record | None:
    """The record under ``k`` whose every capture is still in the cache, or None."""
    f = cache.cache_dir() / KIND / f"{k}.pkl"
    try:
        data = pickle.loads(f.read_bytes())
        cache.touch(f)
    except Exception:  # noqa: BLE001 -- none, or unreadable (another schema's classes): the cold path
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    root = cache.cache_dir()
    if not all((root / c["path"] / "meta.json").is_file() for c in data["captures"].values()):
        return None
    return Record(data)
