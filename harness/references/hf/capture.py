"""HF transformers as a reference: forward hooks read the canonical probes.

Module probes come from forward (pre-)hooks at the points the family names
(``Family.hf_points``). The four probes that live inside the attention function
-- ``q_rope``, ``k_rope`` (what enters the score product), ``attn_probs`` and
``attn_heads`` (softmax(QK)V per head) -- come from wrapping the family's own
eager attention function for the duration of the forward: the model is built
with ``attn_implementation="eager"`` and its attention module looks the
function up in its modeling module's globals at call time
(``ALL_ATTENTION_FUNCTIONS.get_interface(..., eager_attention_forward)``), so
the wrapper sees exactly the tensors HF computes with, sinks and softcap and
masks included. A model whose attention math is inline (bloom, mpt: no eager
function) records those probes through its family's ``hf_taps`` instead.

A capture is a dict ``"L{layer}.{probe}" -> float64 array [seqs, ...]`` plus
model-level ``embeddings``, ``final_norm`` and ``logits``.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
import contextlib

import numpy as np

from harness.lazy import lazy
from contract.probes import STATE_PROBES
from harness.references.hf import layer_major
from harness.references.hf.float64 import promoted

torch = lazy("torch")
modeling_utils = lazy("transformers.modeling_utils")


def _to_np(t):
    return t.detach().to(dtype=torch.float64).cpu().numpy()


def _first_tensor(args, kwargs, key="hidden_states"):
    if key in kwargs and kwargs[key] is not None:
        return kwargs[key]
    return args[0] if args else None


def _resolve(root, path: str):
    """The object at dotted ``path`` under ``root`` (``""``: root), or None. An index
    into a list and a key of a dict-like module count as a step (mlx-lm's modules are
    dicts and hold their layers in lists; torch's ModuleList answers getattr)."""
    obj = root
    for part in [p for p in path.split(".") if p]:
        if isinstance(obj, (list, tuple)) and part.isdigit():
            obj = obj[int(part)] if int(part) < len(obj) else None
        else:
            obj = getattr(obj, part, None) if not isinstance(obj, dict) else obj.get(part, getattr(obj, part, None))
        if obj is None:
            return None
    return obj


@contextmanager
def _wrapped_eager(family, model, sink: dict, attn_implementation: str = "eager",
                   want_layer=lambda i: True, layer_of=lambda module: int(module.layer_idx)):
    """Replace the attention function the model's attention modules call -- the
    eager function in every modeling module they come from, or, for another
    ``attn_implementation`` (sdpa, flex_attention), transformers' registered one
    (``AttentionInterface._global_mapping``, which ``ALL_ATTENTION_FUNCTIONS.
    get_interface`` returns at call time) -- and record what it is called with
    and returns. Only the eager function's second result is the probabilities
    (sdpa returns None, flex_attention the log-sum-exp). Only the layers
    ``want_layer`` keeps are recorded (``--layers``). ``layer_of(module)``: the layer
    a call of the attention ``module`` is recorded as (default its ``layer_idx``; a
    cycled model's: the invocation running now, ``Family.invocation_order``)."""
    patched = []

    def wrap(orig, probs: bool):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            out, weights = orig(module, query, key, value, attention_mask, *args, **kwargs)
            layer = layer_of(module)
            if not want_layer(layer):
                return out, weights
            rec = sink.setdefault(layer, {})
            rec["q_rope"] = _to_np(query)
            rec["k_rope"] = _to_np(key)
            rec["attn_heads"] = _to_np(out)
            if probs and weights is not None:
                rec["attn_probs"] = _to_np(weights)
            return out, weights
        return wrapper

    if attn_implementation == "eager":
        modules = {type(m).__module__ for m in model.modules() if hasattr(m, "layer_idx")}
        for modname in modules:
            mod = sys.modules.get(modname)
            orig = getattr(mod, family.eager_name, None) if mod else None
            if orig is None:
                continue
            setattr(mod, family.eager_name, wrap(orig, True))
            patched.append((mod, family.eager_name, orig))
    else:
        table = modeling_utils.AttentionInterface._global_mapping
        orig = table[attn_implementation]
        table[attn_implementation] = wrap(orig, False)
        patched.append((table, attn_implementation, orig))
    try:
        yield
    finally:
        for owner, attr, orig in patched:
            if isinstance(owner, dict):
                owner[attr] = orig
            else:
                setattr(owner, attr, orig)


def _merge_calls(per_call: list[dict], calls: list[int], n_tok: int) -> dict:
    """The probes of a run's calls put together as one run's: ``[S, T, ...]`` rows
    concatenated; ``attn_probs`` ``[S, H, t, L]`` placed at the call's query rows and at
    the L positions its cache held, the last ones before the call's end (a sliding
    layer's cache keeps only its window); a key read with the cache's rows in front
    (``[S, L, ...]``: ``k_rope``, bloom's and mpt's ``k`` / ``v``) the rows the call
    added (its last t); the states ``[S, 1, ...]`` stacked into ``[S, calls, ...]``."""

    out: dict = {}
    keys = dict.fromkeys(k for d in per_call for k in d)
    for key in keys:
        probe = key.split(".", 1)[-1]
        parts = [d.get(key) for d in per_call]
        if any(p is None for p in parts):
            continue  # a probe some call did not produce is not one of the run's
        if probe in STATE_PROBES:
            out[key] = np.concatenate(parts, axis=1)
        elif probe == "attn_probs":
            s, h = parts[0].shape[:2]
            full = np.zeros((s, h, n_tok, n_tok), dtype=np.result_type(parts[0].dtype, np.float32))
            a = 0
            for t, p in zip(calls, parts):
                width = p.shape[-1]
                full[:, :, a:a + t, a + t - width:a + t] = p
                a += t
            out[key] = full
        else:
            # a key or value read with the cache's rows in front (k_rope from the eager
            # function; bloom / mpt's taps read k, v after the past is concatenated): the
            # rows this call added are its last t
            out[key] = np.concatenate([p[:, p.shape[1] - t:] if p.shape[1] > t else p
                                       for t, p in zip(calls, parts)], axis=1)
    return out


def _no_head(head):
    """What stands in for the output head while a cached-path capture that reads no
    model probe runs (the teacher-forced oracle: nothing reads its logits): zeros of
    the head's shape, no weights to widen or multiply. The single-forward path stops
    after the last layer instead (``StopForward``); a cached call must return its
    cache, so the forward goes on, past a head that computes nothing."""

    out = int(head.weight.shape[0])

    class NoHead(torch.nn.Module):
        def forward(self, x):
            return x.new_zeros(*x.shape[:-1], out)

    m = NoHead()
    # read as `lm_head.weight.dtype` (MambaForCausalLM.forward); a plain attribute, not a parameter
    m.weight = torch.empty(0, dtype=head.weight.dtype)
    return m


@contextmanager
def _without_head(model, skip: bool):
    """``model`` with its output head replaced by ``_no_head`` (``skip``), put back
    after; where the model cannot take the stand-in (no settable head), as it is."""
    old = getattr(model, "get_output_embeddings", lambda: None)() if skip else None
    stub = None
    if old is not None and getattr(old, "weight", None) is not None:
        try:
            stub = _no_head(old)
            model.set_output_embeddings(stub)
            if model.get_output_embeddings() is not stub:
                model.set_output_embeddings(old)
                stub = None
        except (AttributeError, NotImplementedError, TypeError):
            stub = None
    try:
        yield stub is not None
    finally:
        if stub is not None:
            model.set_output_embeddings(old)


def _skip_forward(layer, skipped) -> None:
    """``layer`` passes its input on, computing nothing, whenever ``skipped(layer)``
    (its own ``forward``, as an instance attribute the capture removes after)."""
    orig = layer.forward

    def forward(*args, **kwargs):
        if skipped(layer):
            return args[0] if args else kwargs["hidden_states"]
        return orig(*args, **kwargs)

    layer.forward = forward


def _by_layer(layer_major, dec, calls, tokens, per_call: list, switch, model, logits: bool, put_logits,
              first_group: list) -> bool:
    """HF's cached path on ``calls``, computed layer by layer (``layer_major``): every
    call's forward as the call-by-call loop runs it, each call's probes into its own
    dict of ``per_call``. False (and ``per_call`` left empty) where a cache read
    shows the order cannot reproduce the calls: the caller then runs them one after
    another."""

    starts = [sum(calls[:c]) for c in range(len(calls))]
    mine = [{} for _ in calls]
    seen = [[0] * len(dec) for _ in calls]
    shared = {}

    def grab(mod, args, kwargs):  # the cache call 0's forward made, which every later call is given
        shared.setdefault("cache", kwargs.get("cache", kwargs.get("past_key_values")))

    def one(c: int):
        ids = torch.as_tensor(tokens[:, starts[c]:starts[c] + calls[c]], dtype=torch.long)
        if c and shared.get("cache") is None:
            raise layer_major._Unsynced("call 0's forward handed its decoder layers no cache")
        out = model(input_ids=ids, use_cache=True, **({"cache": shared["cache"]} if c else {}))
        if (getattr(out, "cache", None) or getattr(out, "past_key_values", None)) is not shared.get("cache"):
            raise layer_major._Unsynced("a call returned another cache than the one it was given")
        if logits:
            put_logits(out)

    lm = layer_major.LayerMajor(dec, len(calls), lambda c: switch(c, starts[c], calls[c], mine[c], seen[c]),
                                on_groups=lambda k: first_group.__setitem__(0, k))
    hs = [m.register_forward_pre_hook(grab, with_kwargs=True) for m in dec[:1]]
    try:
        lm.run(one)
    except layer_major._Unsynced:
        return False
    finally:
        for h in hs:
            h.remove()
    per_call[:] = mine
    return True


class StopForward(Exception):
    """Raised from the last decoder layer a capture needs: what follows it (later
    layers, the final norm, the logits) is not computed."""


class _LayerSink(dict):
    """``sink[layer][probe] = array`` (the eager wrapper's and ``hf_taps``' way to
    record) written through to the capture at once, canonical, for the layers and
    probes kept."""

    def __init__(self, put):
        super().__init__()
        self._put = put

    def setdefault(self, i, default=None):
        i = int(i)
        if i not in self:
            dict.__setitem__(self, i, _OneLayer(self._put, i))
        return dict.__getitem__(self, i)


class _OneLayer(dict):
    def __init__(self, put, i):
        super().__init__()
        self._put, self._i = put, i

    def __setitem__(self, probe, arr):
        self._put(self._i, probe, arr)


def capture(family, model, config, layer_cfgs, tokens: np.ndarray, meta: dict | None = None,
            force_inputs=None, sink=None, layers=None, probes=None, float64: bool | None = None,
            model_probes: bool = True, attn_implementation: str = "eager", calls: list[int] | None = None,
            float64_keep: int = 0):
    """Run ``tokens[seqs, T]`` through ``model`` and read every probe into ``sink``
    (a ``harness.store.StoreWriter``: each probe goes to disk the moment it is
    read; default: a dict, returned).

    ``float64``: compute in float64 (default: when the model is held in float64).
    A model held in float32 / bfloat16 then computes module by module in float64
    (``hf_float64.promoted``: each decoder layer, the embeddings and the output
    head widened just before their forward and narrowed back after, exactly, so a
    float64 run costs one layer's float64 copy, not the model's), with every
    float32 side path of the modeling code promoted; ``meta`` (if given) receives
    what could not be promoted.

    ``layers`` / ``probes``: record only these layer indices / probe names
    (``--layers``, ``--probes``; None: all). The forward stops after the last
    decoder layer needed when ``model_probes`` is False (no final norm, no logits).

    ``force_inputs`` (``{"L{i}.layer_in": [seqs, T, hidden]}``): teacher-force HF
    itself -- decoder layer ``i`` computes on that input instead of the previous
    layer's output (a forward pre-hook replaces its ``hidden_states``), while the
    model's own masks, positions and rotary tables are made as always. This is
    the float64 oracle of a low-precision comparison: HF's arithmetic in float64 on
    exactly the layer inputs the low-precision reference saw, so its distance to
    that reference is the reference's own rounding in that layer, not the drift
    of a free-running model (or an MoE routing flip) accumulated before it.

    ``float64_keep``: with ``calls``, the bytes of float64 weight copies a float64
    run may keep from one call to the next (``promoted``'s ``keep_bytes``); a single
    forward keeps none.

    ``attn_implementation``: the transformers attention path ``model`` was set to
    (``set_attn_implementation``); its function is the one wrapped.

    ``calls`` (chunk sizes summing to the tokens; None: one forward without a
    cache): HF's OWN cached path on that schedule -- each call a forward of the
    next chunk of every sequence with ``use_cache=True`` and the cache the previous
    call returned (``reference hf_cached``). Each call's probes are read as
    always and put together after the last (``_merge_calls``: rows along the
    tokens, the probabilities of a call's query rows over the keys its cache
    held, the key rows the call added); the recurrent layers' state after every
    call is read from the cache (``Family.hf_cache_states``: ``state_conv``,
    ``state_rec``, stacked along a ``calls`` axis)."""

    got = {} if sink is None else sink
    want_layer = (lambda i: True) if layers is None else (lambda i: i in set(layers))
    want_probe = (lambda p: True) if probes is None else (lambda p: p in set(probes))
    dec = family.decoder_layers(model)
    # the layers are the INVOCATIONS of the decoder-layer modules (Family.invocation_order:
    # a cycled model runs a module several times per forward, each call its own layer);
    # each module's pre-hook below counts its calls within a forward and sets the layer
    # running, which every hook of the module (and the eager wrapper) records under
    order = family.invocation_order(config)
    n_layers = len(dec) if order is None else len(order)
    layers_of = {m: [i for i in range(n_layers) if family.layer_module(config, i) == m] for m in range(len(dec))}
    running = [-1]
    calls_seen = [0] * len(dec)
    if float64 is None:
        float64 = next(model.parameters()).dtype == torch.float64
    compute = torch.float64 if float64 else next(model.parameters()).dtype
    # the layers whose input / output a later step needs; the forward may stop after the last
    needed = [i for i in range(n_layers) if want_layer(i)]
    last = needed[-1] if needed else -1
    handles = []

    def put(key: str, arr) -> None:
        """One probe, canonical, to the sink (then dropped here)."""
        if key.startswith("L"):
            layer_s, probe = key.split(".", 1)
            i = int(layer_s[1:])
            if not (want_layer(i) and want_probe(probe)) or probe in family.hf_not_exposed:
                return  # (a probe HF computes as another quantity: Family.hf_not_exposed)
            arr = family.hf_probe(probe, arr, layer_cfgs[i])
        elif not want_probe(key):
            return
        got[key] = arr

    def put_layer(i: int, probe: str, arr) -> None:
        if want_layer(i) and want_probe(probe):
            put(f"L{i}.{probe}", arr)

    def hook_for(key: str, io: str, layer_probe: bool = False):
        # a layer probe's key is made at call time: the layer is the invocation running
        name = (lambda: f"L{running[0]}.{key}") if layer_probe else (lambda: key)
        if io == "in":
            def pre(mod, args, kwargs):
                t = _first_tensor(args, kwargs)
                if t is not None:
                    put(name(), _to_np(t))
            return pre, True
        def post(mod, args, kwargs, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if hasattr(t, "detach"):
                put(name(), _to_np(t))
        return post, False

    def enter(m: int):
        """Module ``m``'s n-th call in this forward runs its n-th layer."""
        def pre(mod, args, kwargs):
            n = calls_seen[m]
            if n >= len(layers_of[m]):
                raise RuntimeError(f"{family.name}: decoder layer module {m} ran {n + 1} times in one forward; "
                                   f"its invocation_order lists {len(layers_of[m])}")
            running[0] = layers_of[m][n]
            calls_seen[m] = n + 1
        return pre

    span = [0, tokens.shape[1]]  # the token rows of the current call (the whole sequence without calls)

    def forced():
        """The input the running layer is forced to (None: its own)."""
        i = running[0]
        if f"L{i}.layer_in" not in force_inputs or i > last:
            return None
        # a copy: the input is read-only
        return torch.tensor(np.asarray(force_inputs[f"L{i}.layer_in"])[:, span[0]:span[1]], dtype=compute)

    def stopper(mod, args, kwargs, out):
        if running[0] == last:
            raise StopForward

    # teacher-forced, a decoder layer whose probes are not kept computes what nothing reads:
    # each kept layer's input is forced, so it is skipped (its input passed on; HF's loop
    # hands it to the next layer, whose forcer replaces it). Only the plain decoder layers of
    # a family that declares them (Family.layer_major: one tensor in, one out, its own cache
    # layer) and, on the cached path, only past the layers a call's preamble reads from the
    # cache (the layer-by-layer order's first group, layer_major.py): a skipped layer's cache
    # layer stays empty. --layers 0,-1 on an 8B-class file: 2 of 32 layers computed.
    first_group = [None if calls is not None else -1]
    skippable = {}
    if (force_inputs is not None and order is None and getattr(family, "layer_major", False)
            and all(f"L{i}.layer_in" in force_inputs for i in needed)):
        skippable = {id(dec[m]): m for m in range(len(dec)) if not want_layer(m)}

    def skipped(mod) -> bool:
        m = skippable.get(id(mod))
        return m is not None and first_group[0] is not None and m > first_group[0]

    for m, layer in enumerate(dec):
        mine = layers_of[m]
        if force_inputs is not None and any(f"L{i}.layer_in" in force_inputs and i <= last for i in mine):
            # (Family.hf_force: a pre-hook replacing the layer's input, prepended: the layer_in
            # probe hook below then records the forced input)
            handles.append(family.hf_force(layer, forced))
        if mine and any(want_layer(i) for i in mine):
            # a module's invocations share its modules, so its first layer's points
            for probe, point in family.hf_points_for(config, mine[0]).items():
                mod = _resolve(layer, point.path)
                if mod is None or not want_probe(probe):
                    continue
                fn, is_pre = hook_for(probe, point.io, layer_probe=True)
                if is_pre:
                    handles.append(mod.register_forward_pre_hook(fn, with_kwargs=True))
                else:
                    handles.append(mod.register_forward_hook(fn, with_kwargs=True))
        # registered last and prepended: it runs before the force hook (Family.hf_force) and every probe hook
        handles.append(layer.register_forward_pre_hook(enter(m), with_kwargs=True, prepend=True))
    if not model_probes and last >= 0 and calls is None:
        # (not on the cached path: a call stopped early returns no cache for the next)
        handles.append(dec[family.layer_module(config, last)].register_forward_hook(stopper, with_kwargs=True))
    if model_probes:
        for name, (path, io) in family.hf_model_points.items():
            mod = _resolve(model, path)
            if mod is not None and want_probe(name):
                fn, is_pre = hook_for(name, io)
                reg = mod.register_forward_pre_hook if is_pre else mod.register_forward_hook
                handles.append(reg(fn, with_kwargs=True))

    eager = _LayerSink(put_layer)
    out = None
    per_call: list[dict] = []
    final = got

    def switch(c: int, start: int, size: int, probes: dict, seen: list) -> None:
        """The layer-major run hands over to call ``c`` (``layer_major.LayerMajor``):
        its probes, its rows, its modules' call counts."""
        nonlocal got, calls_seen
        got, calls_seen = probes, seen
        span[:] = [start, start + size]

    def put_logits(out) -> None:
        got["logits"] = out.logits.detach().cpu().double().numpy()

    stream = getattr(model, "conformance_stream", None)  # a model read one layer at a time (gguf/stream.py)
    try:
        # the float64 promotion outermost: the eager wrapper then wraps the promoted function
        # a cached capture that reads no model probe (the teacher-forced oracle) computes no
        # logits: the head outside ``promoted`` too (a tied 49152-row vocabulary was widened
        # to float64 and multiplied on every call for logits nothing reads)
        # HF's cached path layer by layer where the family allows it (layer_major.py): each
        # decoder layer is then widened to float64 once for all the calls, not once a call (a
        # model read from its file one layer at a time, gguf/stream.py: read once for all the
        # calls; the layer left widened is narrowed before the reading drops it: ``flush``)
        by_layer = layer_major.applies(family, config, layer_cfgs, calls)
        for m in skippable.values():
            _skip_forward(dec[m], skipped)
        with _without_head(model, not model_probes and calls is not None) as headless, \
                (promoted(model, family, float64_keep if calls is not None and not by_layer else 0,
                          keep_last=by_layer, skip=skipped) if float64
                 else contextlib.nullcontext()) as fp, torch.no_grad(), \
                _wrapped_eager(family, model, eager, attn_implementation, want_layer,
                               *(() if order is None else (lambda module: running[0],))), \
                family.hf_taps(model, config, eager):
            if stream is not None:  # registered last, prepended: it reads a module before any other hook runs
                handles += stream.install(skip=skipped, flush=getattr(fp, "flush", None))
            if calls is None:
                try:
                    calls_seen[:] = [0] * len(dec)
                    out = model(input_ids=torch.as_tensor(tokens, dtype=torch.long), use_cache=False)
                except StopForward:
                    pass
            elif not (by_layer and _by_layer(layer_major, dec, calls, tokens, per_call, switch, model,
                                             want_probe("logits") and not headless, put_logits, first_group)):
                first_group[0] = None  # call after call: no layer is skipped
                cache = None
                for size in calls:
                    span[:] = [span[1] if per_call else 0, (span[1] if per_call else 0) + size]
                    got = {}  # this call's probes (put() writes here), merged after the last call
                    ids = torch.as_tensor(tokens[:, span[0]:span[1]], dtype=torch.long)
                    calls_seen[:] = [0] * len(dec)
                    out = model(input_ids=ids, use_cache=True, **({} if cache is None else {"cache": cache}))
                    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
                    for i in range(n_layers):
                        if want_layer(i) and getattr(layer_cfgs[i], "has_recurrence", None) is not None:
                            for probe, a in family.hf_cache_states(cache, config, i, layer_cfgs[i]).items():
                                if want_probe(probe):
                                    got[f"L{i}.{probe}"] = a[:, None]  # [S, 1 call, ...]
                    if want_probe("logits") and not headless:
                        put_logits(out)
                    per_call.append(got)
            if calls is not None:
                out = None
                got = final
                for k2, v in _merge_calls(per_call, calls, tokens.shape[1]).items():
                    got[k2] = v
    finally:
        for h in handles:
            h.remove()
        for m in skippable.values():
            dec[m].__dict__.pop("forward", None)
        if stream is not None:
            stream.release_all()
    if meta is not None and fp is not None:
        meta["float64_kept_float32"] = sorted(set(fp.kept_float32))
    if meta is not None and family.hf_tapped:
        # a probe HF names no tensor for, computed by the family's taps (Family.hf_tapped)
        meta["derived"] = {k: family.hf_tapped[k.split(".", 1)[1]] for k in got
                           if k.startswith("L") and k.split(".", 1)[1] in family.hf_tapped}
    if out is not None and want_probe("logits"):
        # no float64 copy of the largest probe: float32 logits (seqs x tokens x vocab, 1 GB
        # at vocab 262144 in float64) go to the sink as they are, a float64 run's as a view
        logits = out.logits.detach().cpu()
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()  # bfloat16 / float16: widened exactly, numpy has no bfloat16
        got["logits"] = logits.numpy()
    del out
    # probes that are views of tensors HF computes with but exposes only inside
    # another (MLA: the rope slices of the query and key the attention function reads)
    for k, v in family.hf_derived(got, config, layer_cfgs).items():
        layer_s, probe = k.split(".", 1)
        if want_layer(int(layer_s[1:])) and want_probe(probe):
            got[k] = v
    return got
