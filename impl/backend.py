"""The array backend: NumPy, or torch on cpu / cuda / mps.

The attention body is written once against the array API standard
(array-api-compat provides a conforming namespace for both libraries); this
module answers the only backend-specific questions: which namespace, which
dtype object, how arrays get on and off the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .config import ConfigError

BACKENDS = ("numpy", "torch")
DEVICES = ("cpu", "cuda", "mps")
DTYPES = ("float64", "float32", "float16", "bfloat16")
LOW_PRECISION = ("float16", "bfloat16")


@dataclass(frozen=True)
class Backend:
    name: str = "numpy"
    device: str = "cpu"
    dtype: str = "float64"

    def __post_init__(self):
        if self.name not in BACKENDS:
            raise ConfigError(f"unknown backend {self.name!r}; valid: {', '.join(BACKENDS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}; valid: {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.name == "numpy":
            if self.device != "cpu":
                raise ConfigError(f"backend numpy runs on cpu only, not {self.device!r}; use --backend torch")
            if self.dtype in LOW_PRECISION:
                raise ConfigError(f"backend numpy has no {self.dtype}; valid: float64, float32 (or --backend torch)")
        if self.name == "torch" and self.device == "mps" and self.dtype == "float64":
            raise ConfigError("mps has no float64; valid there: float32, float16, bfloat16")

    def check_available(self) -> None:
        """Raise ConfigError when the requested device is not present on this machine."""
        if self.name != "torch" or self.device == "cpu":
            return
        import torch

        ok = torch.cuda.is_available() if self.device == "cuda" else torch.backends.mps.is_available()
        if not ok:
            raise ConfigError(f"device {self.device!r} is not available on this machine; valid here: cpu")

    @cached_property
    def xp(self):
        if self.name == "numpy":
            import array_api_compat.numpy as xp
        else:
            import array_api_compat.torch as xp
        return xp

    @cached_property
    def native_dtype(self):
        return getattr(self.xp, self.dtype)

    @cached_property
    def acc_dtype(self):
        """Where a reduction (softmax, norm statistics) is carried out: at least float32,
        as HF does (``softmax(..., dtype=torch.float32)``, ``RMSNorm`` upcasts)."""
        return self.xp.float32 if self.dtype in LOW_PRECISION else self.native_dtype

    @property
    def low_precision(self) -> bool:
        return self.dtype in LOW_PRECISION

    def asarray(self, a, dtype=None):
        """Host data (NumPy, lists, scalars) to a backend array of the compute dtype."""
        dtype = self.native_dtype if dtype is None else dtype
        if self.name == "numpy":
            return np.asarray(a, dtype=dtype)
        import torch

        if isinstance(a, torch.Tensor):
            return a.to(device=self.device, dtype=dtype)
        # Round from float64 exactly once, on the way to the compute dtype.
        return torch.as_tensor(np.asarray(a, dtype=np.float64)).to(device=self.device, dtype=dtype)

    def index(self, a):
        """Integer index array on the backend's device."""
        if self.name == "numpy":
            return np.asarray(a, dtype=np.int64)
        import torch

        return torch.as_tensor(np.asarray(a, dtype=np.int64), device=self.device)

    def mask(self, a):
        """Boolean array on the backend's device."""
        if self.name == "numpy":
            return np.asarray(a, dtype=bool)
        import torch

        return torch.as_tensor(np.asarray(a, dtype=bool), device=self.device)

    def to_numpy(self, a) -> np.ndarray:
        """Back to host float64 (bfloat16 has no NumPy type, so go through float32)."""
        if isinstance(a, np.ndarray):
            return a.astype(np.float64)
        import torch

        return a.detach().to("cpu", dtype=torch.float64).numpy()

    def label(self) -> str:
        return f"{self.name}-{self.device}-{self.dtype}"
