"""Reading ggml tensors from llama.cpp's eval callback.

``struct ggml_tensor`` is mirrored from ``ggml/include/ggml.h`` of the llama.cpp
that llama-cpp-python 0.3.36 vendors (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64,
GGML_MAX_SRC 10, GGML_MAX_NAME 64); the extra pins that release for this
reason. Data is read with ``ggml_backend_tensor_get`` from ``libggml-base`` (so
it works whatever backend holds the buffer) and reinterpreted with the
tensor's own type, shape (``ne``) and byte strides (``nb``): a permuted or
viewed tensor comes out as the array it means, not as its raw storage.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

GGML_MAX_DIMS = 4
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32, GGML_TYPE_BF16 = 0, 1, 26, 30
_NP = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16, GGML_TYPE_I32: np.int32}


class GgmlTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (64 // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class Ggml:
    def __init__(self):
        import llama_cpp

        libdir = Path(llama_cpp.__file__).parent / "lib"
        cands = sorted(libdir.glob("libggml-base.so*")) + sorted(libdir.glob("libggml-base.dylib")) + sorted(libdir.glob("ggml-base.dll"))
        if not cands:
            raise RuntimeError(f"libggml-base not found in {libdir}")
        lib = ctypes.CDLL(str(cands[0]))
        lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        lib.ggml_backend_tensor_get.restype = None
        lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
        lib.ggml_nbytes.restype = ctypes.c_size_t
        lib.ggml_op_name.argtypes = [ctypes.c_int]
        lib.ggml_op_name.restype = ctypes.c_char_p
        lib.ggml_type_name.argtypes = [ctypes.c_int]
        lib.ggml_type_name.restype = ctypes.c_char_p
        self.lib = lib

    @staticmethod
    def header(ptr) -> GgmlTensor:
        return ctypes.cast(ptr, ctypes.POINTER(GgmlTensor)).contents

    def name(self, ptr) -> str:
        return self.header(ptr).name.decode(errors="replace")

    def op_name(self, t: GgmlTensor) -> str:
        return self.lib.ggml_op_name(t.op).decode()

    def read(self, ptr) -> np.ndarray:
        """The tensor as an array of shape ``ne[3], ne[2], ne[1], ne[0]`` (ggml's ne[0]
        is the fastest-moving axis), honouring type and strides."""
        t = self.header(ptr)
        nbytes = int(self.lib.ggml_nbytes(ptr))
        raw = (ctypes.c_uint8 * nbytes)()
        self.lib.ggml_backend_tensor_get(ptr, raw, 0, nbytes)
        buf = np.frombuffer(raw, dtype=np.uint8)
        shape = tuple(int(t.ne[i]) for i in reversed(range(GGML_MAX_DIMS)))
        strides = tuple(int(t.nb[i]) for i in reversed(range(GGML_MAX_DIMS)))
        if t.type == GGML_TYPE_BF16:
            u16 = np.lib.stride_tricks.as_strided(buf.view(np.uint16), shape=shape, strides=strides)
            return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float32)
        if t.type not in _NP:
            raise TypeError(f"tensor {self.name(ptr)!r} has type {self.lib.ggml_type_name(t.type).decode()}, "
                            "which the capture does not read")
        base = buf.view(_NP[t.type]) if nbytes % np.dtype(_NP[t.type]).itemsize == 0 else buf[: nbytes - nbytes % 4].view(_NP[t.type])
        arr = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides)
        return np.array(arr, dtype=np.float32 if t.type != GGML_TYPE_I32 else np.int32)
