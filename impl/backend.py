"""The array backend: NumPy, or torch on cpu / cuda / mps.

The attention body is written once against the array API standard
(array-api-compat provides a conforming namespace for both libraries); this
module answers the only backend-specific questions: which namespace, which
dtype object, how arrays get on and off the device.

Every host <-> device transfer goes through ``asarray`` / ``index`` / ``mask``
(host to device) and ``to_numpy`` (device to host); nothing else in impl may
move an array across the device boundary. ``impl.device_guard`` holds the body
to that (tests/test_device.py runs it on torch's data-less "meta" device, where
a stray host tensor is an error, as it is on cuda / mps).

Two rules keep the transfers valid on every device:
- a dtype change happens on the HOST side of the boundary (round from float64
  on the host, then move; move, then widen on the host): MPS has no float64,
  and a cross-device copy that converts to or from float64 is refused there
  (pytorch issue 122602) or, on torch 2.14's MPS, silently writes nothing
  (issue 197715);
- on cuda, the first use pins the numerics the tolerance policy assumes
  (``pin_cuda_numerics``: IEEE float32 matmuls, no reduced-precision
  reductions), once per process.
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
        import torch  # lazy: only a torch backend loads torch (1.9 s); the NumPy one never does

        ok = torch.cuda.is_available() if self.device == "cuda" else torch.backends.mps.is_available()
        if not ok:
            raise ConfigError(f"device {self.device!r} is not available on this machine; valid here: cpu")

    @cached_property
    def torch(self):
        """The torch module, with the cuda numerics pinned on a cuda backend's first use."""
        import torch  # lazy: only a torch backend loads torch (1.9 s); the NumPy one never does

        if self.device == "cuda":
            pin_cuda_numerics()
        return torch

    @cached_property
    def xp(self):
        if self.name == "torch":
            _ = self.torch  # pins cuda's numerics before the body's first op
        if self.name == "numpy":
            import array_api_compat.numpy as xp  # the chosen backend's namespace (.torch imports torch)
        else:
            import array_api_compat.torch as xp  # lazy: only a torch backend loads torch (1.9 s)
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
        torch = self.torch
        if not isinstance(a, torch.Tensor):
            # Round from float64 exactly once, on the host, on the way to the compute dtype.
            a = torch.as_tensor(np.asarray(a, dtype=np.float64))
        if a.device.type == "cpu":
            return a.to(dtype=dtype).to(device=self.device)  # convert on the host, then move
        return a.to(device=self.device).to(dtype=dtype)

    def index(self, a):
        """Integer index array on the backend's device."""
        if self.name == "numpy":
            return np.asarray(a, dtype=np.int64)
        return self.torch.as_tensor(np.asarray(a, dtype=np.int64)).to(device=self.device)

    def mask(self, a):
        """Boolean array on the backend's device."""
        if self.name == "numpy":
            return np.asarray(a, dtype=bool)
        return self.torch.as_tensor(np.asarray(a, dtype=bool)).to(device=self.device)

    def to_numpy(self, a) -> np.ndarray:
        """Back to host float64: moved in its own dtype, widened on the host (bfloat16
        has no NumPy type; float64 never exists on the device)."""
        if isinstance(a, np.ndarray):
            return a.astype(np.float64)
        return self._host(a.detach()).to(dtype=self.torch.float64).numpy()

    def _host(self, a):
        """The device -> host copy itself, in the tensor's own dtype."""
        return a.to(device="cpu")

    def label(self) -> str:
        return f"{self.name}-{self.device}-{self.dtype}"


# The settings a cuda backend pins (see fixtures/tolerance.toml, "GPU numerics"):
# torch's defaults let cuBLAS round float32 matmul inputs to TF32 (10-bit mantissa,
# off by default for matmul since torch 1.12, but any import may turn it on) and
# let float16 / bfloat16 GEMMs reduce split-K partial sums in the 16-bit type
# (ON by default). Either makes impl on cuda a different computation from impl on
# the CPU and from the references, and the float32 tolerance (nmse 1e-10) would
# fail on TF32 alone. cuDNN (convolutions) is pinned too, for any future caller.
CUDA_NUMERICS = {
    "torch.backends.cuda.matmul.allow_tf32": False,
    "torch.backends.cudnn.allow_tf32": False,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": False,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": False,
    "torch.backends.cuda.matmul.allow_fp16_accumulation": False,
}


def pin_cuda_numerics() -> dict:
    """Set ``CUDA_NUMERICS`` (process-wide; cheap, idempotent) and return what is now
    in force, read back from torch. Settings this torch lacks are skipped and
    reported as ``None``. A float32 matmul precision of "highest" (torch's
    default) is required: a "high" / "medium" set by anyone else is reset, since
    it too allows TF32 / bfloat16 inner products."""
    import torch  # lazy: only a torch backend loads torch (1.9 s); the NumPy one never does

    now = {}
    for dotted, value in CUDA_NUMERICS.items():
        owner_path, attr = dotted.rsplit(".", 1)
        owner = _resolve(torch, owner_path)
        try:
            setattr(owner, attr, value)
            now[dotted] = getattr(owner, attr)
        except (AttributeError, TypeError):  # a torch without this switch
            now[dotted] = None
    if torch.get_float32_matmul_precision() != "highest":
        torch.set_float32_matmul_precision("highest")
    now["torch.get_float32_matmul_precision()"] = torch.get_float32_matmul_precision()
    return now


def _resolve(torch, dotted: str):
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj
