"""A GGUF tensor's numbers and their place in an HF model: ggml's own dequantizer, and
parameters set in place in memory torch's allocator would have given. Shared by the
reader (a file read whole) and stream.py (a file read one layer at a time)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from ..aligned import ALIGN, aligned_empty
from ..errors import UsageError
from harness.lazy import lazy

gguf = lazy("gguf")
torch = lazy("torch")


class _GgmlToFloat(ctypes.Structure):
    # struct ggml_type_traits (ggml/include/ggml.h of the vendored llama.cpp)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


@functools.lru_cache(maxsize=None)
def _ggml_to_float(type_id: int):
    """ggml's own dequantizer of a type (``ggml_get_type_traits(type)->to_float``,
    ggml-quants.c ``dequantize_row_*``: the numbers llama.cpp's get_rows and
    matmuls read), or None without llama-cpp-python."""
    try:
        import llama_cpp  # an optional extra ([llamacpp]): None without it
    except ImportError:
        return None
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(lib_dir.glob("libggml-base.so*")) + sorted(lib_dir.glob("libggml-base.dylib"))
    if not libs:
        return None
    lib = ctypes.CDLL(str(libs[0]))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_GgmlToFloat)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    tr = lib.ggml_get_type_traits(type_id).contents
    return _TO_FLOAT(tr.to_float) if tr.to_float else None


def dequantize(data: np.ndarray, tensor_type) -> np.ndarray:
    """One tensor's raw data (gguf-py's layout) as float32: ggml's own ``to_float``
    (C, the dequantization llama.cpp runs; 20x gguf-py's numpy on K-quants),
    else ``gguf.quants.dequantize``. Flat."""

    fn = _ggml_to_float(int(tensor_type)) if tensor_type not in (gguf.GGMLQuantizationType.F32,) else None
    if fn is None:
        return np.asarray(gguf.quants.dequantize(data, tensor_type), dtype=np.float32).reshape(-1)
    block, size = gguf.GGML_QUANT_SIZES[tensor_type]
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    n = raw.size // size * block
    out = aligned_empty(n)
    fn(raw.ctypes.data, out.ctypes.data, n)
    return out


def dequantizer(info):
    """A callable giving tensor ``info`` as float32 in numpy order (ggml's ne reversed)."""
    shape = tuple(int(d) for d in reversed(info.shape.tolist()))

    def get():
        return dequantize(info.data, info.tensor_type).reshape(shape)
    return get


def place(model, state: dict, path: str) -> tuple[list[str], list[str]]:
    """``state``'s arrays made ``model``'s parameters and buffers in place -- each
    Parameter object stays (a tied head stays tied) and takes the array's memory
    (``load_state_dict`` copied every tensor into the model's own: a second copy of
    the model at once, and a pass over it). An array not aligned as torch's
    allocator aligns is copied into such memory first, so every weight lies where a
    loaded one did. ``(missing, unexpected)`` as ``load_state_dict(strict=False)``."""

    sd = model.state_dict(keep_vars=True)
    unexpected = [k for k in state if k not in sd]
    missing = [k for k in sd if k not in state]
    for k, v in state.items():
        if k not in sd:
            continue
        t = sd[k]
        if tuple(t.shape) != tuple(v.shape):
            raise UsageError(f"--gguf {path}: {k} has shape {tuple(v.shape)}, the HF model's is {tuple(t.shape)}")
        out = param_tensor(v)
        owner, _, name = k.rpartition(".")
        mod = model.get_submodule(owner)
        if name in mod._parameters:
            set_param(mod._parameters[name], out)
        else:
            mod._buffers[name] = out
    return missing, unexpected


def param_tensor(v):
    """Array ``v`` as a float32 tensor in memory aligned as torch's allocator aligns
    (``ALIGN``): its own memory where it is so, else a copy."""

    arr = np.asarray(v, dtype=np.float32)
    if arr.ctypes.data % ALIGN or not arr.flags.c_contiguous or not arr.flags.writeable:
        out = torch.empty(arr.shape, dtype=torch.float32)
        out.numpy()[...] = arr
        return out
    return torch.from_numpy(arr)


def set_param(p, value) -> None:
    """Parameter ``p`` (the same object: hooks and a tied head keep it) now holds
    ``value``: its ``.data`` where the device stays, else the two swapped whole
    (a parameter on the meta device, read layer by layer: gguf/stream.py)."""

    if p.device == value.device:
        p.data = value
    else:
        torch.utils.swap_tensors(p, torch.nn.Parameter(value, requires_grad=p.requires_grad))
