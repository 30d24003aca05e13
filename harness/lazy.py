"""Third-party packages a module names at its top but imports on first use.

Why: start-up. Measured on the 2-core machine (2026-12-08, a fresh process, `import X`
alone): torch 1.9 s, transformers 0.8 s, matplotlib.pyplot 0.45 s, pandas 0.36 s, gguf
0.12 s, hypothesis 0.11 s -- against the targets `conformance --help` <= 0.5 s, a bad
`--set` refused <= 1 s and a warm tiny run <= 2 s (scripts/bench_startup.py), which import
none of torch, transformers, pandas or matplotlib (tests/test_bad_input.py,
tests/test_first_hour.py and tests/test_warm_path.py hold it). The optional engines'
packages (onnx, ctranslate2, openvino, mlx) may be absent altogether.

So such a module declares them with its other imports, ``torch = lazy("torch")``, and the
import happens where the module first touches one -- what an import inside each function
did, named once at the top where a reader (and a grep) finds it. The project's own modules
are never loaded this way: they are plain imports, which import-linter sees."""

from __future__ import annotations

import importlib
import sys


class _Lazy:
    """A stand-in for module ``name`` (``binds``: the package ``import a.b`` binds, ``a``):
    every attribute read, write or delete goes to the module, imported on the first."""

    __slots__ = ("_name", "_binds")

    def __init__(self, name: str, binds: str | None = None):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_binds", binds or name)

    def _module(self):
        mod = sys.modules.get(self._binds)
        if mod is None or self._name not in sys.modules:
            importlib.import_module(self._name)
            mod = sys.modules[self._binds]
        return mod

    def __getattr__(self, attr):
        return getattr(self._module(), attr)

    def __setattr__(self, attr, value):
        setattr(self._module(), attr, value)

    def __delattr__(self, attr):
        delattr(self._module(), attr)

    def __dir__(self):
        return dir(self._module())

    def __repr__(self) -> str:
        loaded = "loaded" if self._name in sys.modules else "not loaded yet"
        return f"<lazy module {self._binds!r} ({loaded})>"


def lazy(name: str, binds: str | None = None):
    """Module ``name``, imported when first used (``binds``: for ``import a.b``, ``"a"``)."""
    return _Lazy(name, binds)
