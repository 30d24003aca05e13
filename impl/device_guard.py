"""A guard that holds the body to one device, checkable without a GPU.

On cuda or mps a host tensor that meets a device tensor is an error -- or,
worse, an implicit copy and a device sync that nobody asked for -- while on
the CPU backend the same code runs silently. ``DeviceGuard`` makes the CPU
see what a device would: a ``TorchFunctionMode`` that watches every torch
call the body makes and raises ``DeviceLeak`` when

- a tensor goes in or comes out anywhere but the guarded device (a stray
  host tensor, a 0-dim host scalar tensor, an index array left on the host,
  a ``.cpu()`` / ``.to("cpu")``);
- a tensor is pulled to the host implicitly (``.numpy()``, ``np.asarray``
  via ``__array__``, ``.item()``, ``.tolist()``, ``float()`` / ``int()`` /
  ``bool()`` of a tensor: each a device sync);
- with ``forbid_float64`` (what MPS requires): a float64 tensor is made on
  the device, or a copy across the device boundary converts to or from
  float64 (MPS refuses the first and, on torch 2.14, silently drops the
  second: pytorch issues 122602, 197715).

Only ``impl.backend.Backend``'s transfer methods may cross the boundary;
``GuardedBackend`` marks them so. Run the body on torch's ``"meta"`` device
(tensors with shapes and dtypes and no data) and every placement mistake
raises on a machine without a GPU; run it on ``"cuda"`` under the same guard
and the real device is held to the same rules (tests/test_device.py, the
``gpu`` tests of scripts/device_check.sh).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from .backend import DTYPES, Backend
from .config import ConfigError


class DeviceLeak(RuntimeError):
    """A tensor crossed the device boundary outside ``Backend``'s transfer methods."""


# Tensor methods that hand a device tensor's data to the host (each syncs the device).
HOST_PULLS = frozenset({"numpy", "__array__", "item", "tolist", "__float__", "__int__", "__bool__", "__index__",
                        "__complex__"})
_PERMITTED = [0]  # > 0 while a Backend transfer method runs


@contextlib.contextmanager
def permitted():
    """The one place a tensor may cross the boundary: ``GuardedBackend``'s transfers."""
    _PERMITTED[0] += 1
    try:
        yield
    finally:
        _PERMITTED[0] -= 1


def _tensors(tree):
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class _Mode(TorchFunctionMode):
    def __init__(self, guard: "DeviceGuard"):
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.guard._call(func, args, kwargs or {})


class DeviceGuard:
    """``with DeviceGuard("meta", forbid_float64=True) as g: run the body``;
    ``g.ops`` counts the torch calls it checked, ``g.tensors`` the tensors they made."""

    def __init__(self, device: str, forbid_float64: bool = False):
        self.device = torch.device(device)
        self.forbid_float64 = forbid_float64
        self.ops = 0
        self.tensors = 0
        self._mode = None

    def __enter__(self):
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)

    # ------------------------------------------------------------------ checks
    def _on_device(self, t) -> bool:
        d = t.device
        return d.type == self.device.type and (self.device.index is None or d.index == self.device.index)

    def _call(self, func, args, kwargs):
        name = getattr(func, "__name__", str(func))
        if _PERMITTED[0]:
            if self.forbid_float64 and name in ("to", "copy_"):
                self._check_boundary_float64(name, args, kwargs)
            return func(*args, **kwargs)
        self.ops += 1
        if name in HOST_PULLS:
            raise DeviceLeak(f"{name}() pulls a tensor to the host outside Backend.to_numpy (an implicit device sync)")
        for t in _tensors((args, kwargs)):
            if not self._on_device(t):
                raise DeviceLeak(f"{name} got a {tuple(t.shape)} {t.dtype} tensor on {t.device}, expected "
                                 f"{self.device.type}: a host array crossed into the body outside the Backend")
        out = func(*args, **kwargs)
        made = _tensors(out)
        for t in made:
            if not self._on_device(t):
                raise DeviceLeak(f"{name} made a {tuple(t.shape)} {t.dtype} tensor on {t.device}, expected "
                                 f"{self.device.type}: pass device= (or go through the Backend)")
            if self.forbid_float64 and t.dtype == torch.float64:
                raise DeviceLeak(f"{name} made a float64 tensor {tuple(t.shape)} on {self.device.type}, "
                                 "which has none on mps")
        self.tensors += len(made)
        return out

    @staticmethod
    def _check_boundary_float64(name, args, kwargs):
        """Before the copy runs: ``src.to(device, dtype)`` / ``dst.copy_(src)`` that crosses
        the boundary AND converts to or from float64 in the same copy."""
        if name == "to":
            src, device, dtype = args[0], kwargs.get("device"), kwargs.get("dtype")
            for a in args[1:]:
                if isinstance(a, torch.dtype):
                    dtype = a
                elif isinstance(a, (str, torch.device)):
                    device = a
                elif isinstance(a, torch.Tensor):
                    device, dtype = a.device, a.dtype
            dst_dev = torch.device(device).type if device is not None else src.device.type
            dst_dtype = dtype if dtype is not None else src.dtype
        else:
            dst, src = args[0], args[1]
            dst_dev, dst_dtype = dst.device.type, dst.dtype
        if not isinstance(src, torch.Tensor):
            return
        if src.device.type != dst_dev and src.dtype != dst_dtype and torch.float64 in (src.dtype, dst_dtype):
            raise DeviceLeak(f"{name} converts {src.dtype} on {src.device.type} to {dst_dtype} on {dst_dev} in one "
                             "copy: a float64 conversion across the device boundary (mps refuses it); convert on "
                             "the host, then move")


@dataclass(frozen=True)
class GuardedBackend(Backend):
    """A ``Backend`` whose transfer methods are the guard's permitted crossings,
    and which also runs on torch's data-less ``"meta"`` device (where
    ``to_numpy`` hands back zeros of the tensor's shape: the guard checks where
    arrays live, not their values)."""

    def __post_init__(self):
        if self.device == "meta":
            if self.name != "torch":
                raise ConfigError("the meta device is torch's; use backend torch")
            if self.dtype not in DTYPES:
                raise ConfigError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
            return
        super().__post_init__()

    def asarray(self, a, dtype=None):
        with permitted():
            return super().asarray(a, dtype)

    def index(self, a):
        with permitted():
            return super().index(a)

    def mask(self, a):
        with permitted():
            return super().mask(a)

    def to_numpy(self, a) -> np.ndarray:
        with permitted():
            return super().to_numpy(a)

    def _host(self, a):
        if self.device != "meta":
            return super()._host(a)
        if a.device.type != "meta":
            raise DeviceLeak(f"to_numpy got a tensor on {a.device}, expected meta")
        return torch.zeros(tuple(a.shape), dtype=a.dtype)  # meta holds no data to copy
