"""The HF adapter's hook points, checked against the installed transformers before
any case runs.

The adapter reads HF where HF computes: forward hooks on module paths
(``Family.hf_points``), the eager attention function its attention modules call
(``Family.eager_name``), the functions a recurrent mixer calls for its conv and
its scan (``families/_recurrent.py``: they are functions, so no module hook fires
there), and, for the float64 oracle, the source of every function of the modeling
module (``float64.py`` recompiles them with float32 promoted). Each is an internal
of transformers that a release may move: 5.25.0 moved the Mamba mixers' conv
behind ``causal_conv1d_forward`` and made the decorated functions ``nn.Module``
instances (``internals.py``). Met in the middle of a matrix, such a move was a
``KeyError: 'hidden_states'`` in 63 cases; checked here, it is one line naming
the release and what is missing, before any work (``check``, exit 2).

What is checked, per family (on its model built on the meta device: no weights):

- every probe point path resolves to a module of every decoder layer, and every
  model-level point to a module of the model;
- the eager function is a function of the attention module's modeling module, takes
  the arguments the wrapper reads, and the attention module's ``forward`` calls it;
- for each recurrent layer kind, the functions ``RECURRENT_FUNCTIONS`` names for it
  are functions of the mixer's modeling module, take the arguments the taps read,
  and the mixer's ``forward`` reaches each (directly or through the module's own
  functions: 5.25.0's ``causal_conv1d_forward`` calls ``causal_conv1d_fn``);
- every function of those modeling modules is one whose source the float64 oracle
  can read (a wrapper it cannot see into would leave a float32 path in a "float64" run);
- a modeling module with RoPE classes keeps its default RoPE where
  ``hf_default_rope_reads`` reads it (``compute_default_rope_parameters``).
"""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import version
from pathlib import Path

from ...errors import UsageError
from . import internals
from harness.lazy import lazy
from ... import cache
from ...versions import versions

torch = lazy("torch")
transformers = lazy("transformers")

# the functions the recurrent taps wrap (families/_recurrent.py), per layer kind, with the
# parameters the wrappers read by name -- in HF's own signature, so a rename is seen
_CONV = (("causal_conv1d_fn", ("hidden_states",)), ("causal_conv1d_update", ("hidden_states",)))
_DELTA = ("query", "key", "value", "g", "beta")
_MAMBA = ("hidden_states", "dt", "A", "B", "C")
RECURRENT_FUNCTIONS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "gated_delta_net": _CONV + (("torch_chunk_gated_delta_rule", _DELTA), ("torch_recurrent_gated_delta_rule", _DELTA),
                                ("l2norm", ("x",))),
    "kimi_delta": _CONV + (("chunk_kimi_delta_attention", _DELTA), ("recurrent_kimi_delta_attention", _DELTA),
                           ("l2norm", ("x",))),
    "mamba2": _CONV + (("mamba2_chunk_scan", _MAMBA + ("dt_bias", "dt_softplus", "dt_limit")),
                       ("mamba2_selective_state_update", _MAMBA + ("dt_bias", "dt_softplus"))),
    "mamba1": _CONV + (("mamba_selective_scan", _MAMBA + ("z", "delta_bias", "delta_softplus")),
                       ("mamba_selective_state_update", _MAMBA + ("z", "dt_bias", "dt_softplus"))),
    "short_conv": _CONV,
    "lightning": (),  # minimax: module hooks and the cache only
}
# the eager attention wrapper's positional parameters (capture.py _wrapped_eager)
EAGER_PARAMS = ("module", "query", "key", "value", "attention_mask")


class HookPointMissing(UsageError):
    """A hook point the HF adapter needs is not in the installed transformers."""


def supported() -> str:
    """The transformers releases the adapter has been run on (``SUPPORTED`` in
    ``references/hf/__init__.py``), for the refusal's last words."""
    from . import SUPPORTED  # a cycle: the package's __init__ imports this module before it sets SUPPORTED

    lo, hi = SUPPORTED
    return f"supported {lo}-{hi}"


def _release() -> str:
    try:
        return f"transformers {version('transformers')}"
    except Exception:  # noqa: BLE001 -- a source checkout without metadata

        return f"transformers {transformers.__version__}"


def _refuse(what: str):
    raise HookPointMissing(f"{_release()}: {what}; {supported()} (docs/how-to/reference-released.md)")


def _meta_model(family, config):
    kw = {} if family.experts_implementation is None else {"experts_implementation": family.experts_implementation}
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", **kw)


def _sub(root, path: str):
    obj = root
    for part in [p for p in path.split(".") if p]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _layer_kind(family, config, i: int) -> str:
    """The layer's kind (contract: ``attention``, ``mla``, a recurrent kind)."""
    return str(getattr(family.layer_config(config, i), "kind", ""))


def _check_function(mod, name: str, params: tuple[str, ...], caller_cls, what: str) -> None:
    obj = getattr(mod, name, None)
    short = mod.__name__.rpartition(".")[2]
    if obj is None:
        _refuse(f"{short} has no `{name}` ({what})")
    fn = internals.plain(obj)
    if fn is None:
        _refuse(f"{short}.{name} is a {type(obj).__name__}, not a function the adapter can wrap ({what})")
    have = inspect.signature(fn).parameters
    lost = [p for p in params if p not in have]
    if lost:
        _refuse(f"{short}.{name} no longer takes {', '.join(f'`{p}`' for p in lost)} ({what})")
    if caller_cls is not None and not internals.reaches(caller_cls.forward, name):
        _refuse(f"the {caller_cls.__name__} no longer calls `{name}` ({what})")


def _check_default_rope(mod) -> None:
    """A modeling module with RoPE classes keeps its default RoPE in a method
    ``compute_default_rope_parameters`` that families/base.py ``hf_default_rope_reads``
    reads the source of (does it read ``partial_rotary_factor``? llama's does not, phi's
    does): renamed, that helper would take every key as read, and llama's partial
    rotary factor would silently rotate part of the head where HF rotates all of it."""
    rots = [c for c in vars(mod).values()
            if isinstance(c, type) and c.__module__ == mod.__name__ and c.__name__.endswith("RotaryEmbedding")]
    if rots and not any("compute_default_rope_parameters" in vars(c) for c in rots):
        _refuse(f"{rots[0].__name__} ({mod.__name__.rpartition('.')[2]}) defines no compute_default_rope_parameters, "
                "whose source says which keys HF's default RoPE reads (families/base.py hf_default_rope_reads)")


def _check_float64_sources(mod) -> None:
    """Every function-like object the modeling module defines is one whose source the
    float64 oracle can read (float64.py ``patch_module_functions``)."""
    for attr, val in vars(mod).items():
        if isinstance(val, type) or not callable(val) or getattr(val, "__module__", None) != mod.__name__:
            continue
        if inspect.isfunction(val) or internals.plain(val) is not None:
            continue
        if isinstance(val, (staticmethod, classmethod)) or inspect.isbuiltin(val):
            continue
        short = mod.__name__.rpartition(".")[2]
        _refuse(f"{short}.{attr} is a {type(val).__name__} whose source the float64 oracle cannot read")


def check(family, config, cached: bool = False) -> None:
    """Refuse (``HookPointMissing``, a ``UsageError``: exit 2, one line) when the
    installed transformers lacks a hook point ``family`` needs on ``config``;
    ``cached``: HF's own cached path too (reference hf_cached)."""
    key = (family.name, type(family), type(config), config.to_json_string(use_diff=False), cached)
    if key in _CHECKED:
        return
    stamp = _stamp(family, key)
    if stamp is not None and stamp.is_file():  # passed before on this release, these sources
        _CHECKED.add(key)
        return
    _check(family, config, cached)
    _CHECKED.add(key)
    if stamp is not None:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text("ok\n")
        except OSError:  # a read-only cache: checked again next time
            pass


_CHECKED: set = set()  # what passed in this process (a matrix's workers check each family once)


def _stamp(family, key):
    """Where a passed check is remembered: keyed by everything it reads -- the installed
    transformers (its version and the kernels package that wraps its functions), the
    family's code and config, and this module's (0.1 s a family on a cold start: 9 s
    over the 88 families of the default matrix, paid once per release)."""

    try:
        v = versions()
        src = cache.source_hash(*cache.family_sources(family), Path(__file__), Path(internals.__file__))
        return cache.cache_dir() / "preflight" / f"hf-{cache.key(list(map(str, key)), v.get('transformers'), v.get('kernels'), v.get('torch'), src)}"
    except OSError:
        return None


def _check(family, config, cached: bool = False) -> None:
    model = _meta_model(family, config)
    if cached:
        # capture.py runs HF's cached path as model(input_ids, use_cache=True, cache=...) and
        # reads out.cache / out.past_key_values: `cache` is 5.24.0's name (5.23.0 and before:
        # past_key_values, and the Mamba models' cache_params)
        params = inspect.signature(internals.plain(type(model).forward) or type(model).forward).parameters
        if "cache" not in params:
            _refuse(f"{type(model).__name__}.forward takes no `cache` (HF's cached path, reference hf_cached)")
    layers = family.decoder_layers(model)
    modules = set()
    for path, _io in getattr(family, "hf_model_points", {}).values():
        if _sub(model, path) is None:
            _refuse(f"{type(model).__name__} has no `{path}` (a model-level probe point of {family.name})")
    seen_kinds: set[tuple] = set()
    for i in range(len(family.layer_configs(config))):  # noqa: B007
        try:
            layer = family.decoder_layer(model, config, i)
        except (IndexError, AttributeError):
            _refuse(f"{type(model).__name__} has no decoder layer {i} at `{family.layers_path}`")
        modules.add(sys.modules[type(layer).__module__])
        # the points of the probes this layer computes (an MLA layer with a direct Q has no
        # q_latent: its q_a_layernorm is absent by design, not moved)
        want = set(getattr(family.layer_config(config, i), "expected_probes", lambda: ())())
        for probe, point in family.hf_points_for(config, i).items():
            if probe in want and _sub(layer, point.path) is None:
                _refuse(f"{type(layer).__name__} has no `{point.path}` (the {probe} probe's point of {family.name})")
        kind = _layer_kind(family, config, i)
        if (kind, type(layer)) in seen_kinds:
            continue
        seen_kinds.add((kind, type(layer)))
        funcs = RECURRENT_FUNCTIONS.get(kind)
        if funcs is not None and funcs and getattr(family, "hf_rec_module", None):
            mixer = _sub(layer, family.hf_rec_module)
            if mixer is None:
                _refuse(f"{type(layer).__name__} has no `{family.hf_rec_module}` (the {kind} mixer of {family.name})")
            mod = sys.modules[type(mixer).__module__]
            modules.add(mod)
            for fname, params in funcs:
                _check_function(mod, fname, params, type(mixer), f"the {kind} probes' hook point")
    eager = getattr(family, "eager_name", None)
    n_layers = len(family.layer_configs(config))
    if eager and eager != "-" and any(_layer_kind(family, config, i) in ("attention", "mla") for i in range(n_layers)):
        callers = [m for m in model.modules() if hasattr(m, "layer_idx")
                   and internals.reaches(type(m).forward, eager)]
        if not callers:
            mods = {type(m).__module__ for m in model.modules() if hasattr(m, "layer_idx")}
            where = ", ".join(sorted(m.rpartition(".")[2] for m in mods)) or type(model).__module__
            _refuse(f"no attention module of {where} calls `{eager}` (the q_rope / k_rope / attn_probs / "
                    "attn_heads hook point)")
        for m in {sys.modules[type(c).__module__] for c in callers}:
            modules.add(m)
            _check_function(m, eager, EAGER_PARAMS, None, "the attention probes' hook point")
    for m in model.modules():
        if type(m).__module__.startswith("transformers.models."):
            modules.add(sys.modules[type(m).__module__])
    for mod in modules:
        _check_float64_sources(mod)
        _check_default_rope(mod)
