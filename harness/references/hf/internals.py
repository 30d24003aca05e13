"""The internals of transformers that the HF adapter reaches into, in one place.

The adapter records what HF computes by wrapping functions of a modeling module
in place (the eager attention, a recurrent layer's conv and scan functions,
``l2norm``) and promotes HF's float32 side paths by recompiling those functions
from their own source (``float64.py``). Both read transformers' internals, and
those move from release to release. transformers 5.25.0 is the example this
module was written for:

- it requires the ``kernels`` package, whose ``use_kernel_forward_from_hub``
  (kernels ``_internals/layer/layer.py``, ``_create_func_module``) turns a
  decorated FUNCTION into an instance of a one-off ``nn.Module`` subclass
  (``Func``) whose ``forward(self, *args, **kwargs)`` calls the original through
  a closure. ``inspect.isfunction`` says no to it, its signature is
  ``(*args, **kwargs)`` and ``inspect.getsource`` cannot reach HF's code. In
  5.24.0 (no ``kernels`` dependency) transformers' own stub decorator returned
  the function unchanged (``integrations/hub_kernels.py``, the ``else:`` branch
  of ``if is_kernels_available()``);
- its recurrent mixers call new module functions (``causal_conv1d_forward``,
  ``mamba_scan_forward``) that in turn call the conv and scan functions the
  adapter wraps (``modeling_mamba.py``, ``modeling_qwen3_next.py`` and their
  siblings).

``plain(obj)`` is HF's own Python function behind any of those wrappers.
``reaches(root, name)`` follows a function's calls through its module's
globals, so a hook point is checked for what the forward really calls
(``hook_points.py`` checks them before any case runs).
"""

from __future__ import annotations

import inspect
import sys
import types


def _func_module_inner(obj):
    """The function a kernels ``Func`` module calls (its ``forward``'s closure holds
    it, kernels ``_create_func_module``), or None when ``obj`` is not one."""
    fwd = getattr(type(obj), "forward", None)
    if fwd is None or not getattr(fwd, "__closure__", None) or "_create_func_module" not in type(obj).__qualname__:
        return None
    for cell in fwd.__closure__:
        try:
            val = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(val):
            return val
    return None


def plain(obj):
    """The Python function behind ``obj``: through kernels' ``Func`` modules and
    ``functools.wraps`` wrappers (transformers' ``use_kernel_func_from_hub_with_fallback``
    keeps ``__wrapped__``); ``obj`` itself when it is a plain function; None when
    there is no function behind it."""
    seen = 0
    while obj is not None and seen < 8:
        seen += 1
        inner = _func_module_inner(obj)
        if inner is not None:
            obj = inner
            continue
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
            continue
        if inspect.isfunction(obj):
            return inspect.unwrap(obj)
        if getattr(obj, "__wrapped__", None) is not None:  # functools.lru_cache and kin
            obj = obj.__wrapped__
            continue
        return None
    return None


def is_function_like(obj) -> bool:
    """A module-level callable HF wrote: a function, or one hidden in a wrapper."""
    return plain(obj) is not None


def signature(obj) -> inspect.Signature:
    """The signature of HF's own function behind ``obj`` (a ``Func`` module's is
    ``(*args, **kwargs)``: binding it names no argument)."""
    fn = plain(obj)
    return inspect.signature(fn if fn is not None else obj)


def called_names(fn) -> set[str]:
    """The global names ``fn``'s code (and its nested code objects) loads."""
    code = fn.__code__
    out, todo = set(), [code]
    while todo:
        c = todo.pop()
        out.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


def reaches(root, name: str, depth: int = 4) -> bool:
    """Whether HF's function ``root`` (a method, or a module function) calls the global
    ``name`` of its module, directly or through the module's other functions (up to
    ``depth`` calls deep): 5.25.0's Mamba mixer calls ``causal_conv1d_fn`` only from
    inside ``causal_conv1d_forward``."""
    fn = plain(root)
    if fn is None:
        return False
    glb = fn.__globals__
    seen, frontier = set(), [fn]
    for _ in range(depth + 1):
        nxt = []
        for f in frontier:
            if f in seen:
                continue
            seen.add(f)
            names = called_names(f)
            if name in names:
                return True
            for n in names:
                g = plain(glb.get(n))
                if g is not None and g.__module__ == fn.__module__ and g not in seen:
                    nxt.append(g)
        frontier = nxt
    return False


def module_of(obj) -> types.ModuleType | None:
    """The modeling module a class (or an instance's class) is defined in."""
    cls = obj if isinstance(obj, type) else type(obj)
    return sys.modules.get(cls.__module__)
