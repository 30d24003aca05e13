"""A GGUF file's metadata and tensor table, read in one pass.

``gguf.GGUFReader`` builds a numpy memmap view for every part of every field:
on a real file's tokenizer (Gemma 3: 262,144 tokens, scores and types) that is
millions of views -- 15 s on an idle machine, the largest part of reading a
270M file (the run's ``gguf_import``). This reader follows the same format
(gguf-py ``gguf_reader.py`` / ggml ``gguf.cpp`` ``gguf_init_from_file_impl``:
magic, version, tensor and key counts, the key/value pairs, the tensor infos,
the data section at ``general.alignment``) and decodes the values directly:
numeric arrays with one ``np.frombuffer``, strings sliced from the bytes.
Tensors are ``Tensor`` records shaped like gguf-py's ``ReaderTensor`` (``shape``
in ggml's ne order, ``data`` a view of the memory-mapped file in gguf-py's own
layout: typed for float / int tensors, bytes per row for quantized ones), so
``gguf.quants.dequantize`` takes them as it takes gguf-py's.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np

from harness.lazy import lazy

gguf = lazy("gguf")

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
       10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9


class Tensor(NamedTuple):
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray  # ggml's ne order (fastest axis first), as gguf-py's ReaderTensor
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFFile:
    """``values`` (key -> Python value: str, number, bool, list) and ``tensors``."""
    def __init__(self, path: str):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        buf = self.mm
        self.pos = 0
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("no GGUF magic")
        self.pos = 4
        version, = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reader takes 2 and 3)")
        n_tensors, n_kv = self._unpack("<QQ")
        # gguf-py's reader lists the header's counts as fields too
        self.values: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
        for _ in range(n_kv):
            key = self._string()
            vtype, = self._unpack("<I")
            self.values[key] = self._value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims, = self._unpack("<I")
            dims = np.frombuffer(self._take(8 * n_dims), dtype="<u8").copy()
            ttype, offset = self._unpack("<IQ")
            infos.append((name, dims, ttype, offset))
        align = int(self.values.get("general.alignment", 32) or 32)
        start = self.pos + (-self.pos % align)
        names = set()
        self.tensors: list[Tensor] = []
        for name, dims, ttype, offset in infos:
            if name in names:
                raise ValueError(f"duplicated tensor {name}")
            names.add(name)
            qt = gguf.GGMLQuantizationType(ttype)
            n = int(np.prod(dims)) if dims.size else 1
            block, size = gguf.GGML_QUANT_SIZES[qt]
            n_bytes = n * size // block
            lo = start + int(offset)
            np_dims = tuple(int(d) for d in reversed(dims.tolist()))
            item = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
                    gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
                    gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
                    gguf.GGMLQuantizationType.I64: np.int64}.get(qt)
            raw = buf[lo:lo + n_bytes]
            if raw.size != n_bytes:
                raise ValueError(f"tensor {name} is cut short")
            if item is None:
                data = raw.reshape(gguf.quant_shape_to_byte_shape(np_dims, qt))
            else:
                data = raw.view(item).reshape(np_dims)
            self.tensors.append(Tensor(name, qt, dims.astype(np.uint64), n, n_bytes, lo, data))

    # ------------------------------------------------------------ decoding
    def _take(self, n: int):
        lo = self.pos
        self.pos += n
        if self.pos > self.mm.size:
            raise ValueError("the file ends inside its header")
        return self.mm[lo:self.pos]

    def _unpack(self, fmt: str):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)).tobytes())

    def _string(self) -> str:
        n, = self._unpack("<Q")
        return self._take(n).tobytes().decode("utf-8", errors="replace")

    def _value(self, vtype: int):
        if vtype == STRING:
            return self._string()
        if vtype in _SCALAR:
            return self._unpack(_SCALAR[vtype])[0]
        if vtype != ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        etype, count = self._unpack("<IQ")
        if etype in _NP:
            a = np.frombuffer(self._take(count * np.dtype(_NP[etype]).itemsize), dtype=np.dtype(_NP[etype]).newbyteorder("<"))
            return a.tolist()
        if etype == STRING:
            return self._strings(count)
        return [self._value(etype) for _ in range(count)]

    def _strings(self, count: int) -> list[str]:
        # a window of bytes for the run of strings (slicing bytes is cheap, memmap views
        # are not), doubled whenever a string reaches past it
        out = []
        size = max(4096, 32 * count)
        tail = self.mm[self.pos:self.pos + size].tobytes()
        p = 0
        for _ in range(count):
            while p + 8 > len(tail) or p + 8 + int.from_bytes(tail[p:p + 8], "little") > len(tail):
                if self.pos + len(tail) >= self.mm.size:
                    raise ValueError("the file ends inside its header")
                size *= 2
                tail = self.mm[self.pos:self.pos + size].tobytes()
            n = int.from_bytes(tail[p:p + 8], "little")
            out.append(tail[p + 8:p + 8 + n].decode("utf-8", errors="replace"))
            p += 8 + n
        self.pos += p
        return out
