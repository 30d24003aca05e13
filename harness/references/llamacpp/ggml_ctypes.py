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
from importlib.util import find_spec

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


def ggml_base_path(pkg_dir: Path | None = None) -> Path:
    """libggml-base of the installed llama-cpp-python (found without importing it)."""
    if pkg_dir is None:

        spec = find_spec("llama_cpp")
        if spec is None or not spec.origin:
            raise RuntimeError("llama_cpp is not installed")
        pkg_dir = Path(spec.origin).parent
    libdir = pkg_dir / "lib"
    cands = sorted(libdir.glob("libggml-base.so*")) + sorted(libdir.glob("libggml-base.dylib")) + sorted(libdir.glob("ggml-base.dll"))
    if not cands:
        raise RuntimeError(f"libggml-base not found in {libdir}")
    return cands[0]


class _InitParams(ctypes.Structure):  # ggml.h struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def layout_mismatch(lib_path: Path) -> str | None:
    """What of ``GgmlTensor`` the library at ``lib_path`` lays out otherwise, or None.

    The library itself says where its fields are: a context (no data allocated) makes
    a 2-D float32 tensor named by ``ggml_set_name``, a view of it and a sum of two;
    each field the capture reads (type, ne, nb, op, src, view_src, view_offs, name)
    must hold, at this mirror's offset, what the library's own accessors
    (``ggml_get_name``, ``ggml_nbytes``, ``ggml_op_name``) and the construction say,
    and the mirror's size must be the library's (``ggml_tensor_overhead`` less the
    ``ggml_object`` header, 32 bytes since ggml's first release). A release that adds
    or moves a field before ``name`` fails here, not as garbage arrays."""
    lib = ctypes.CDLL(str(lib_path))
    for fn, res, args in (("ggml_init", ctypes.c_void_p, [_InitParams]), ("ggml_free", None, [ctypes.c_void_p]),
                          ("ggml_tensor_overhead", ctypes.c_size_t, []),
                          ("ggml_new_tensor_2d", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                                                   ctypes.c_int64]),
                          ("ggml_set_name", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
                          ("ggml_get_name", ctypes.c_void_p, [ctypes.c_void_p]),
                          ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
                          ("ggml_add", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
                          ("ggml_view_1d", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                             ctypes.c_size_t]),
                          ("ggml_op_name", ctypes.c_char_p, [ctypes.c_int])):
        f = getattr(lib, fn, None)
        if f is None:
            return f"libggml-base exports no {fn}"
        f.restype, f.argtypes = res, args
    size = int(lib.ggml_tensor_overhead()) - 32
    if size != ctypes.sizeof(GgmlTensor):
        return f"struct ggml_tensor is {size} bytes, the mirror {ctypes.sizeof(GgmlTensor)}"
    ctx = lib.ggml_init(_InitParams(16 * int(lib.ggml_tensor_overhead()), None, True))
    if not ctx:
        return "ggml_init failed"
    try:
        a = lib.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 5)
        b = lib.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 5)
        lib.ggml_set_name(a, b"conformance-layout")
        s = lib.ggml_add(ctx, a, b)
        v = lib.ggml_view_1d(ctx, a, 2, 8)
        ta, ts, tv = (ctypes.cast(p, ctypes.POINTER(GgmlTensor)).contents for p in (a, s, v))
        checks = {
            "type": ta.type == GGML_TYPE_F32,
            "ne": list(ta.ne) == [3, 5, 1, 1],
            "nb": list(ta.nb) == [4, 12, 60, 60] and int(lib.ggml_nbytes(a)) == 60,
            "name": lib.ggml_get_name(a) == a + GgmlTensor.name.offset and ta.name == b"conformance-layout",
            "op": lib.ggml_op_name(ts.op) == b"ADD" and lib.ggml_op_name(ta.op) == b"NONE",
            "src": ts.src[0] == a and ts.src[1] == b,
            "view_src": tv.view_src == a and tv.view_offs == 8,
        }
    finally:
        lib.ggml_free(ctx)
    bad = [k for k, ok in checks.items() if not ok]
    return f"struct ggml_tensor's {', '.join(bad)} field{'s' if len(bad) > 1 else ''} moved" if bad else None


class Ggml:
    def __init__(self):
        lib = ctypes.CDLL(str(ggml_base_path()))
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
