"""HF in float64 that means float64: every float32 side path promoted.

A model moved to float64 with ``.to(torch.float64)`` still computes parts of
its forward in float32, because the modeling code names float32 explicitly:
``LlamaRMSNorm.forward`` upcasts with ``hidden_states.to(torch.float32)`` (a
DOWNcast for a float64 input), ``eager_attention_forward`` runs
``softmax(..., dtype=torch.float32)``, the rotary embeddings build ``inv_freq``
with ``dtype=torch.float`` at construction and take cos/sin of
``position_ids.float() * inv_freq.float()`` (``*RotaryEmbedding.forward``,
``modeling_rope_utils._compute_*_parameters``). Judged against such a run,
a float64 candidate could only ever be held to float32 -- where a subtle bug
(a norm epsilon of 1e-5 instead of 1e-6: NMSE 1.8e-11) hides under rounding.

``float64_paths(model)`` rewrites, for the duration of a capture, HF's OWN
source of every function on that path -- the methods of the model's module
classes, the module-level functions of their modeling modules (the eager
attention) and the RoPE initialisers (``ROPE_INIT_FUNCTIONS``) -- replacing
``torch.float32`` / ``torch.float`` / ``.float()`` by float64, and rebuilds
the rotary embeddings so ``inv_freq`` is computed in float64. The arithmetic
is HF's, step for step; only the precision changes. A method that cannot be
recompiled outside its class (it calls zero-argument ``super()``) is left as
it is and named in ``kept_float32``, so the capture says what it did not
promote.
"""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
from contextlib import contextmanager

from .internals import plain
from harness.lazy import lazy
from .rope import apply_freq_factors

torch = lazy("torch")
mru = lazy("transformers.modeling_rope_utils")

_PATTERNS = (
    (re.compile(r"torch\.float32\b"), "torch.float64"),
    (re.compile(r"torch\.float\b(?!\d)"), "torch.float64"),
    (re.compile(r"\.float\(\)"), ".double()"),
)


_AUTO_DOCSTRING = re.compile(r"^@auto_docstring[ \t]*$", re.M)


def _needs(src: str) -> bool:
    return any(p.search(src) for p, _ in _PATTERNS)


def _promote(src: str) -> str:
    for p, new in _PATTERNS:
        src = p.sub(new, src)
    return src


def _recompile(func, name: str):
    """``func`` (a plain function, possibly decorated) recompiled from its source
    with float32 promoted, in its own module's globals; None when its source is
    out of reach or it needs its class cell (zero-argument super())."""
    try:
        src = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return None
    if not _needs(src) or "super()" in src:
        return None
    # HF's @auto_docstring only writes the docstring, and re-applied to a method compiled
    # outside its class it takes the function for a class (Mamba2ForCausalLM.forward:
    # "'function' object has no attribute '__mro__'"): the line is blanked, keeping the numbering
    src = _AUTO_DOCSTRING.sub("", src)
    code = inspect.unwrap(func).__code__
    ns: dict = {}
    glb = inspect.unwrap(func).__globals__
    exec(compile("\n" * (code.co_firstlineno - 1) + _promote(src), code.co_filename, "exec"), glb, ns)
    return ns.get(name)


class Float64Paths:
    def __init__(self):
        self.patched: list[tuple[object, str, object]] = []  # (owner, attribute, original)
        self.kept_float32: list[str] = []

    def _set(self, owner, attr: str, new) -> None:
        self.patched.append((owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)))
        setattr(owner, attr, new)

    def patch_class(self, cls) -> None:
        for klass in cls.__mro__:
            # the modeling code of the families; PreTrainedModel's utilities (float(),
            # from_pretrained) are not on the forward path
            if not klass.__module__.startswith("transformers.models.") or klass in self._done:
                continue
            self._done.add(klass)
            for attr, val in list(vars(klass).items()):
                if attr == "__init__":  # construction: its float32 buffers are widened by .to(float64)
                    continue
                fn = val.__func__ if isinstance(val, (staticmethod, classmethod)) else val
                if not inspect.isfunction(fn):
                    continue
                try:
                    src = inspect.getsource(fn)
                except (OSError, TypeError):
                    continue
                if not _needs(src):
                    continue
                new = _recompile(fn, attr)
                if new is None:
                    self.kept_float32.append(f"{klass.__name__}.{attr}")
                    continue
                if isinstance(val, staticmethod) and not isinstance(new, staticmethod):
                    new = staticmethod(new)
                self._set(klass, attr, new)

    def patch_module_functions(self, modname: str) -> None:
        mod = sys.modules.get(modname)
        if mod is None or modname in self._done_mods:
            return
        self._done_mods.add(modname)
        for attr, val in list(vars(mod).items()):
            # a function HF wrote, or one a decorator hid: transformers >= 5.25 requires
            # `kernels`, whose use_kernel_forward_from_hub makes a decorated function an
            # nn.Module instance (internals.py); the global is replaced by the promoted
            # function itself, which is what that wrapper calls on the CPU
            fn = plain(val)
            if fn is None or fn.__module__ != modname:
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if _needs(src):
                new = _recompile(fn, fn.__name__)
                if new is None:
                    self.kept_float32.append(f"{modname}.{attr}")
                else:
                    self._set(mod, attr, new)

    def patch_rope_inits(self) -> None:
        self.patch_module_functions(mru.__name__)
        table = mru.ROPE_INIT_FUNCTIONS
        for kind, fn in list(table.items()):
            new = getattr(mru, fn.__name__, fn)  # the promoted module function, where patched
            if new is not fn:
                self.patched.append((table, kind, fn))
                table[kind] = new

    def restore(self) -> None:
        for owner, attr, orig in reversed(self.patched):
            if isinstance(owner, dict):
                owner[attr] = orig
            else:
                setattr(owner, attr, orig)
        self.patched.clear()

    _done: set
    _done_mods: set


def _rebuild_rotary(model) -> list[tuple[object, str, object]]:
    """Re-create every rotary embedding under the promoted initialisers: its
    ``inv_freq`` buffers were computed in float32 when the model was built, and
    ``.to(torch.float64)`` only widens the rounded values. Every rotary class in
    transformers 5 is constructed from the config alone (``XRotaryEmbedding(config)``).
    Returns ``(parent, attribute, original)`` for each, to put back."""

    replaced = []
    for name, mod in list(model.named_modules()):
        if "RotaryEmbedding" not in type(mod).__name__ or not hasattr(mod, "config"):
            continue
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        fresh = type(mod)(mod.config).to(torch.float64)
        # a GGUF's rope_freqs (--gguf), which no HF RoPE type computes from the config:
        # divided in again, now in float64 (references/hf/rope.py apply_freq_factors)
        apply_freq_factors(fresh, mod.config)
        attr = name.rpartition(".")[2]
        replaced.append((parent, attr, mod))
        setattr(parent, attr, fresh)
    return replaced


def _rebuild_config_buffers(model) -> list[tuple[object, str, object]]:
    """Re-compute the buffers HF computes from the config in float32 when the model is
    built, by the modeling module's own function, now in float64 (the default dtype
    inside ``float64_paths``): falcon_h1's ``mup_vector`` (modeling_falcon_h1.py
    ``FalconH1Model.__init__``: ``compute_mup_vector(config)``, ``torch.ones`` in the
    default dtype, then ``register_buffer``), whose multipliers ``.to(torch.float64)``
    would only widen from their float32 roundings. Returns ``(module, buffer,
    original)`` for each, to put back."""

    replaced = []
    for m in model.modules():
        if "mup_vector" not in m._buffers:
            continue
        fn = getattr(sys.modules.get(type(m).__module__), "compute_mup_vector", None)
        if fn is None:
            continue
        orig = m._buffers["mup_vector"]
        # float64 whatever the model is held in: promoted() widens a float32-held layer's
        # tensors just before its forward, which would only widen the rounded values again
        m._buffers["mup_vector"] = fn(model.config).to(device=orig.device, dtype=torch.float64)
        replaced.append((m, "mup_vector", orig))
    return replaced


def _float_tensors(module, recurse: bool):
    """``(owner, kind, name, tensor)`` for the floating parameters and buffers of
    ``module`` (its own only, or its whole subtree)."""
    mods = module.modules() if recurse else (module,)
    for m in mods:
        for kind, table in (("p", m._parameters), ("b", m._buffers)):
            for name, t in table.items():
                if t is not None and t.is_floating_point():
                    yield m, kind, name, t


class _Kept:
    """float64 copies of parameters kept from one forward to the next within one
    ``promoted`` block, up to ``limit`` bytes (first come, first kept): HF's cached
    path makes a forward per call, and widening every layer again for each of them
    was most of a cached float64 capture (a 135M-class model, 13 calls: 94 s of a
    903 s run under load). Parameters only: they do not change during a no_grad
    forward, while a buffer may be replaced or updated in place."""

    def __init__(self, limit: int):
        self.limit, self.used = int(limit), 0
        self.copies: dict[int, tuple] = {}  # id(parameter) -> (parameter, its float64 copy)

    def get(self, t):
        hit = self.copies.get(id(t))
        return None if hit is None else hit[1]

    def offer(self, t, wide) -> bool:
        n = wide.numel() * wide.element_size()
        if self.used + n <= self.limit:
            self.copies[id(t)] = (t, wide)  # the parameter is held too: its id is not reused
            self.used += n
            return True
        return False


class _Pool:
    """Float64 buffers of the shapes widened, handed back when a module is narrowed
    and taken again for the next one of the same shape, up to ``limit`` bytes held
    free. A fresh allocation of a large tensor is a fresh mapping whose every page
    faults on first write -- widening into one was 3.4x the cost of copying into a
    buffer already mapped (a 1B-class file's float64 oracle: 21M page faults, 62 s
    of system time). ``copy_`` into the buffer is the conversion ``.to`` makes:
    exact, every float32 / bfloat16 / float16 value is a float64."""

    def __init__(self, limit: int):
        self.limit, self.held = int(limit), 0
        self.free: list = []  # the buffers handed back, oldest first

    def widened(self, t, dtype):
        key = (tuple(t.shape), dtype, t.device)
        for j, buf in enumerate(self.free):
            if (tuple(buf.shape), buf.dtype, buf.device) == key:
                del self.free[j]
                self.held -= buf.numel() * buf.element_size()
                return buf.copy_(t)
        return torch.empty(t.shape, dtype=dtype, device=t.device).copy_(t)

    def give(self, buf) -> None:
        # the newest kept, the oldest let go past the limit (a head of another shape
        # than the layers does not crowd out the next layer's buffers)
        self.free.append(buf)
        self.held += buf.numel() * buf.element_size()
        while self.held > self.limit and self.free:
            old = self.free.pop(0)
            self.held -= old.numel() * old.element_size()


class _Retyped:
    """Floating tensors changed to another dtype in place and changed back exactly:
    the original tensor is kept and put back (float32 / bfloat16 / float16 -> float64
    -> the same type is the identity, so this is the value a narrowing would give,
    without converting the module a second time). ``kept``: a ``_Kept`` the widened
    parameters are taken from and offered to; ``pool``: a ``_Pool`` the widened
    copies are made in and handed back to (those not kept)."""

    def __init__(self, kept: _Kept | None = None, pool: _Pool | None = None):
        self.saved: list[tuple[object, str, str, object, object]] = []  # (owner, kind, name, original, pooled copy)
        self.kept = kept
        self.pool = pool

    def widen(self, items, dtype) -> None:
        seen = set()
        for m, kind, name, t in items:
            if id(t) in seen or t.dtype == dtype:
                continue
            seen.add(id(t))  # a tied weight is one tensor, changed once
            wide = self.kept.get(t) if self.kept is not None and kind == "p" else None
            pooled = None
            if wide is None:
                wide = t.to(dtype) if self.pool is None or kind != "p" else self.pool.widened(t, dtype)
                if self.kept is not None and kind == "p" and self.kept.offer(t, wide):
                    pass  # kept for the block's later forwards: never handed back
                elif self.pool is not None and kind == "p":
                    pooled = wide
            # a parameter's own storage (``.data`` of the Parameter object, which stays)
            self.saved.append((m, kind, name, t.data if kind == "p" else t, pooled))
            _set(m, kind, name, wide)

    def restore(self) -> None:
        for m, kind, name, orig, pooled in reversed(self.saved):
            _set(m, kind, name, orig)
            if pooled is not None:
                self.pool.give(pooled)
        self.saved.clear()


def _set(m, kind: str, name: str, value) -> None:
    if kind == "p":
        m._parameters[name].data = value  # the Parameter object stays (hooks, ties)
    else:
        m._buffers[name] = value


@contextmanager
def promoted(model, family, keep_bytes: int = 0, keep_last: bool = False, skip=None):
    """Within the block, ``model`` -- held in float32, bfloat16 or float16, or
    already float64 -- computes in float64 with every float32 side path of its
    modeling code promoted, as ``model.to(torch.float64)`` under
    ``float64_paths`` would, at the cost of ONE module's float64 copy: each
    decoder layer, the input embeddings and the output head are widened in place
    just before their forward and narrowed back right after (exactly: every value
    of the narrower type is a float64), the small rest of the model (norms,
    rotary tables, biases) for the whole block. A 1B-class model in float64 is
    7 GB; one of its layers is 360 MB. ``keep_bytes``: float64 copies of up to
    that many bytes are kept for the block's later forwards (``_Kept``: a
    capture of several calls). ``keep_last``: a decoder layer stays widened after
    its forward until another decoder layer is widened (or the block ends) -- the
    layer-by-layer cached path (layer_major.py) calls each layer for every call in
    turn, so it is widened once, and still one layer is in float64 at a time.
    Yields the ``Float64Paths`` record."""

    f64 = torch.float64
    big = list(family.decoder_layers(model))
    for get in ("get_input_embeddings", "get_output_embeddings"):
        m = getattr(model, get, lambda: None)()
        if m is not None:
            big.append(m)
    in_big = {id(t) for m in big for _, _, _, t in _float_tensors(m, True)}
    rest = _Retyped()
    handles, rotary = [], []
    jit: dict[int, _Retyped] = {}
    kept = _Kept(keep_bytes) if keep_bytes > 0 else None
    # one module's float64 copy held free between forwards: the next layer of the same
    # shapes is widened into it (the plan's "float64 module" part counts one module)
    pool = _Pool(max((sum(t.numel() for *_, t in _float_tensors(m, True)) * 8 for m in big), default=0))

    def gathers(mod) -> bool:
        # a plain lookup table (torch.nn.Embedding itself, no max_norm renormalising its rows
        # in place): the rows it returns widened ARE the rows a widened table returns -- a
        # gather does no arithmetic -- so the table is not copied to float64 (a 49152 x 576
        # vocabulary: 226 MB per forward, for a few dozen rows; HF's scaled embeddings,
        # Gemma3TextScaledWordEmbedding, multiply and are widened as any module)
        return type(mod) is torch.nn.Embedding and mod.max_norm is None

    layers = {id(m) for m in family.decoder_layers(model)}
    pending = [None]  # the decoder layer left widened (keep_last)

    def widen(mod, args, kwargs):
        if gathers(mod) or (skip is not None and skip(mod)):
            return None
        if id(mod) in layers and pending[0] is not None and pending[0] is not mod:
            jit[id(pending[0])].restore()
            pending[0] = None
        r = jit.setdefault(id(mod), _Retyped(kept, pool))
        r.widen(_float_tensors(mod, True), f64)
        # an input the caller cast to the module's dtype BEFORE this hook widened it
        # (Mamba2ForCausalLM / MambaForCausalLM.forward: `lm_head(hidden_states.to(
        # self.lm_head.weight.dtype))`) is widened with it: exact, as the weights are
        def up(t):
            return t.to(f64) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != f64 else t
        return tuple(up(a) for a in args), {k: up(v) for k, v in kwargs.items()}

    def narrow(mod, args, kwargs, out):
        if skip is not None and skip(mod):
            return None
        if gathers(mod):
            return out.to(f64) if isinstance(out, torch.Tensor) and out.is_floating_point() else out
        if keep_last and id(mod) in layers:
            pending[0] = mod  # narrowed when the next layer is widened (its tensors are float64 already)
            return
        r = jit.get(id(mod))
        if r is not None:
            r.restore()

    def flush() -> None:
        """The layer left widened narrowed now (a model read layer by layer drops a layer
        just before it reads the next: gguf/stream.py; narrowed first, so it is dropped,
        not put back)."""
        if pending[0] is not None:
            jit[id(pending[0])].restore()
            pending[0] = None

    with float64_paths(model, rebuild=False) as fp:
        fp.flush = flush
        try:
            rotary = _rebuild_rotary(model)
            rest.widen((x for mod in model.modules() for x in _float_tensors(mod, False) if id(x[3]) not in in_big),
                       f64)
            for m in big:
                handles.append(m.register_forward_pre_hook(widen, with_kwargs=True, prepend=True))
                handles.append(m.register_forward_hook(narrow, with_kwargs=True, always_call=True))
            yield fp
        finally:
            for h in handles:
                h.remove()
            for r in jit.values():
                r.restore()
            rest.restore()
            for parent, attr, orig in reversed(rotary):
                setattr(parent, attr, orig)


@contextmanager
def float64_paths(model, rebuild: bool = True):
    """Within the block, ``model`` (already in float64) computes every float32 side
    path of its modeling code in float64. Yields the ``Float64Paths`` record
    (``kept_float32``: what could not be promoted). ``rebuild``: re-create the
    rotary embeddings (put back on exit)."""

    fp = Float64Paths()
    fp._done, fp._done_mods = set(), set()
    rotary, buffers = [], []
    # the float32 no source line names: an integer tensor's true division (Ministral3Attention's
    # get_llama_4_attn_scale: torch.floor(position_ids / original_max_position_embeddings)) and
    # a Python float made a tensor come out in the default dtype
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        fp.patch_rope_inits()
        for m in model.modules():
            fp.patch_class(type(m))
            fp.patch_module_functions(type(m).__module__)
        if rebuild:
            rotary = _rebuild_rotary(model)
        buffers = _rebuild_config_buffers(model)
        yield fp
    finally:
        torch.set_default_dtype(default)
        for parent, attr, orig in reversed(rotary):
            setattr(parent, attr, orig)
        for m, name, orig in reversed(buffers):
            m._buffers[name] = orig
        fp.restore()
