"""mlx-lm's model of a case, read layer by layer (the reference ``mlx``).

mlx-lm (Apple's MLX team and its community) implements ~130 architectures from
the papers and the HF code, independently of transformers and of llama.cpp: a
third witness where those two disagree. Its model of a case is built from the
very checkpoint the HF reference builds (saved with ``save_pretrained`` into a
temporary folder, read by ``mlx_lm.utils.load_model`` as a user's download
would be), and run on the case's schedule through mlx-lm's own caches
(``mlx_lm.models.cache.make_prompt_cache``): one call per chunk, every sequence
of the batch in lockstep, as ``hf_cached`` runs HF's.

MLX has no forward hooks. A module's class ``__call__`` is wrapped for the
duration of the capture and records, for the instances the family's probe
points name, the first array it is called with or what it returns -- the same
points as HF's (``Family.hf_points``: mlx-lm names its modules as transformers
does; where a family's mlx-lm module lacks a point, the probe is not exposed and
says so). The attention's own tensors come from wrapping the
``scaled_dot_product_attention`` the model's module calls
(``mlx_lm.models.base``, imported into every model module): the queries and
keys after RoPE and the heads' output. ``mx.fast.scaled_dot_product_attention``
is one fused kernel, so the probabilities are not exposed.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np

from ..hf.capture import _resolve  # one path walk for both references (lists and dict-like modules too)
from .families import OWN_VALUE, SDPA_MLA, mlx_path
from harness.lazy import lazy
from ..hf.capture import _merge_calls

mx = lazy("mlx.core")
models_cache = lazy("mlx_lm.models.cache")

# the probes the scaled_dot_product_attention wrapper reads, and where HF's eager layout agrees
SDPA_PROBES = ("q_rope", "k_rope", "attn_heads")
NOT_EXPOSED = {
    "attn_probs": "mlx-lm computes attention with mx.fast.scaled_dot_product_attention, one fused kernel: "
                  "the probabilities are never an array (mlx_lm/models/base.py scaled_dot_product_attention)",
}


def _np(a) -> np.ndarray:
    if a.dtype in (mx.bfloat16, mx.float16):
        a = a.astype(mx.float32)  # numpy has no bfloat16: widened exactly
    return np.array(a, copy=True)


def decoder_layers(family, model) -> list:
    """The decoder layers of mlx-lm's model: at the family's HF path (``model.layers``
    in most), else at the paths mlx-lm uses for other trees."""
    for path in (mlx_path(family.name, family.layers_path), "model.layers", "layers", "backbone.layers",
                 "transformer.h", "model.h"):
        got = _resolve(model, path)
        if isinstance(got, (list, tuple)) and got:
            return list(got)
    raise RuntimeError(f"mlx-lm's {type(model).__module__} holds no decoder layers at {family.layers_path}")


class _Calls:
    """``cls.__call__`` wrapped for the duration: ``record(instance, args, out)`` for
    every call of an instance in ``watch``."""

    def __init__(self):
        self.watch: dict[int, list] = {}  # id(instance) -> [(probe key maker, io)]
        self.patched: list = []

    def add(self, inst, key, io: str) -> None:
        self.watch.setdefault(id(inst), []).append((key, io))
        cls = type(inst)
        if any(c is cls for c, _ in self.patched):
            return
        orig = cls.__call__
        watch = self.watch
        sink = self

        def __call__(self_, *args, **kwargs):
            out = orig(self_, *args, **kwargs)
            for key, io in watch.get(id(self_), ()):
                if io == "in":
                    x = args[0] if args else next(iter(kwargs.values()), None)
                else:
                    x = out[0] if isinstance(out, (tuple, list)) else out
                if x is not None and hasattr(x, "dtype"):
                    sink.put(key(), x)
            return out

        self.patched.append((cls, orig))
        cls.__call__ = __call__

    def restore(self) -> None:
        for cls, orig in reversed(self.patched):
            cls.__call__ = orig
        self.patched.clear()


def capture(family, model, config, layer_cfgs, tokens: np.ndarray, calls: list[int], want_layer, want_probe,
            meta: dict) -> dict:
    """mlx-lm's probes of the case, canonical (``"L{i}.{probe}"`` and the model
    probes), its calls put together as HF's cached path's are."""

    layers = decoder_layers(family, model)
    n_layers = len(layer_cfgs)
    if len(layers) != n_layers:
        raise RuntimeError(f"mlx-lm's model has {len(layers)} decoder layers, the family's config {n_layers}")
    running = [-1]
    got: dict = {}
    own = frozenset(OWN_VALUE.get(family.name, {}))

    def canonical(probe, arr, lc):  # HF's completing product, except where mlx-lm's output is its own value
        return family.hf_probe(probe, arr, lc, own)

    hooks = _Calls()
    absent: dict = {}

    def put_raw(key: str, arr) -> None:
        if key.startswith("L"):
            layer_s, probe = key.split(".", 1)
            i = int(layer_s[1:])
            if not (want_layer(i) and want_probe(probe)):
                return
            got[key] = canonical(probe, _np(arr), layer_cfgs[i])
        elif want_probe(key):
            got[key] = _np(arr)

    hooks.put = put_raw
    kinds = set()
    for i, layer in enumerate(layers):
        kind = getattr(layer_cfgs[i], "kind", "")
        kinds.add(kind)
        if not want_layer(i):
            continue
        hooks.add(layer, (lambda i=i: f"L{i}.layer_in"), "in")
        hooks.add(layer, (lambda i=i: f"L{i}.layer_out"), "out")
        for probe, point in family.hf_points_for(config, i).items():
            if probe in ("layer_in", "layer_out") or not want_probe(probe):
                continue
            path = mlx_path(family.name, point.path)
            mod = _resolve(layer, path)
            if mod is None or not callable(mod):
                absent[probe] = (f"mlx-lm's {type(model).__module__.rpartition('.')[2]} has no module at "
                                 f"{path!r} in its decoder layer (HF's point of {probe})")
                continue
            hooks.add(mod, (lambda i=i, p=probe: f"L{i}.{p}"), point.io)

    # which layer runs: every decoder layer's call sets it, before its own hooks record
    entered: list = []
    for i, layer in enumerate(layers):
        entered.append(id(layer))
    index = {lid: i for i, lid in enumerate(entered)}
    layer_classes = {type(x) for x in layers}
    orig_layer_calls = {}
    for cls in layer_classes:
        inner = cls.__call__

        def enter(self_, *args, __inner=inner, **kwargs):
            running[0] = index.get(id(self_), running[0])
            return __inner(self_, *args, **kwargs)

        orig_layer_calls[cls] = inner
        cls.__call__ = enter
    for name, (path, io) in family.hf_model_points.items():
        mod = _resolve(model, mlx_path(family.name, path))
        if name in meta.get("not_exposed", {}) or not want_probe(name):
            continue
        if mod is not None and callable(mod):
            hooks.add(mod, (lambda n=name: n), io)
        else:
            absent[name] = (f"mlx-lm's {type(model).__module__.rpartition('.')[2]} has no module at "
                            f"{mlx_path(family.name, path)!r} (HF's point of {name})")

    def sdpa_wrap(orig):
        def wrapper(queries, keys, values, *args, **kwargs):
            out = orig(queries, keys, values, *args, **kwargs)
            i = running[0]
            kind = getattr(layer_cfgs[i], "kind", "") if i >= 0 else ""
            if i >= 0 and want_layer(i) and (kind == "attention" or (kind == "mla" and family.name in SDPA_MLA)) \
                    and getattr(layer_cfgs[i], "shape", "gqa") == "gqa":
                cache = args[0] if args else kwargs.get("cache")
                if want_probe("q_rope"):
                    got[f"L{i}.q_rope"] = canonical("q_rope", _np(queries), layer_cfgs[i])
                # the keys are the call's rows after the cache's in order only from a plain KVCache:
                # a RotatingKVCache (a sliding window) hands over its ring buffer as it lies
                ordered = cache is None or type(cache).__name__ in ("KVCache", "ConcatenateKVCache")
                # a layer reading an earlier layer's K / V (LayerConfig.kv_source: gemma3n, gemma4) is
                # handed that layer's keys: a sliding one's are its RotatingKVCache's ring
                # (mlx_lm/models/gemma4_text.py make_cache), whatever this layer's own cache is
                src = getattr(layer_cfgs[i], "kv_source", None)
                if src is not None and getattr(layer_cfgs[src], "window", None) is not None:
                    ordered = False
                if want_probe("k_rope") and ordered:
                    got[f"L{i}.k_rope"] = canonical("k_rope", _np(keys), layer_cfgs[i])
                elif not ordered:
                    absent.setdefault("k_rope", f"mlx-lm's {type(cache).__name__} hands the attention its window's "
                                                "keys in ring order (mlx_lm/models/cache.py), not the call's rows")
                if want_probe("attn_heads"):  # [B, H, L, D] -> HF eager's [B, L, H, D]
                    got[f"L{i}.attn_heads"] = canonical("attn_heads",
                                                                  _np(out).transpose(0, 2, 1, 3), layer_cfgs[i])
            return out
        return wrapper

    mods = {sys.modules[type(x).__module__] for x in layers} | {sys.modules[type(model).__module__]}
    sdpa_patched = []
    for mod in mods:
        fn = getattr(mod, "scaled_dot_product_attention", None)
        if fn is not None:
            sdpa_patched.append((mod, fn))
            mod.scaled_dot_product_attention = sdpa_wrap(fn)
    if not sdpa_patched:
        for p in SDPA_PROBES:
            absent[p] = "mlx-lm's model module calls no scaled_dot_product_attention the capture can wrap"
    per_call: list[dict] = []
    try:
        cache = models_cache.make_prompt_cache(model)
        start = 0
        for size in calls:
            got = {}
            ids = mx.array(tokens[:, start:start + size].astype(np.int32))
            out = model(ids, cache=cache)
            if want_probe("logits"):
                got["logits"] = _np(out)
            mx.eval(out)
            per_call.append(got)
            start += size
    finally:
        for cls, inner in orig_layer_calls.items():  # the last wrapped first
            cls.__call__ = inner
        hooks.restore()
        for mod, fn in sdpa_patched:
            mod.scaled_dot_product_attention = fn
    merged = _merge_calls(per_call, calls, tokens.shape[1]) if len(calls) > 1 else per_call[0]
    if family.name in SDPA_MLA:  # HF's views of the naive MLA's query and key (q_pe, k_pe)
        for k, v in family.hf_derived(merged, config, layer_cfgs).items():
            if want_layer(int(k.split(".", 1)[0][1:])) and want_probe(k.split(".", 1)[1]):
                merged[k] = v
    meta["not_exposed"] = {**NOT_EXPOSED, **absent, **(meta.get("not_exposed") or {})}
    meta["mlx_model"] = type(model).__module__
    return merged
