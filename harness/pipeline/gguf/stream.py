"""A ``--gguf`` file read one decoder layer at a time: a model too large to hold
as a float32 HF model (an 8B-class file: 32 GB) on the machine that runs it.

The HF model is built as always, its parameters on torch's meta device (no
memory; buffers such as the RoPE tables are made in ``__init__`` as always).
Each of its large modules -- every decoder layer, the input embedding, the
output head -- is a unit whose parameters are read from the file just before
the module computes (``ensure``: the same reverse map, ``Trace.tensor``, the
same dequantization, the same placing as ``reader.place``, so the module holds
exactly what the in-memory path holds) and dropped again after: at most one
decoder layer at a time (the embedding and the head stay until ``release_all``,
which the case calls after each capture). Everything else (the final norm, a
head's bias) is read once. What runs on the model is HF's own forward; the
capture hooks ``ensure`` in before any other hook of the module
(references/hf/capture.py), and runs HF's cached path layer by layer
(references/hf/layer_major.py: each layer read once for all the calls).

The file is read through its mapping, and the pages of each tensor are given
back after it is read (``madvise(MADV_DONTNEED)``): otherwise the mapped file
counts in this process's resident memory as it is read, all 4.9 GB of it, twice
over with llama.cpp's worker mapping the same file.

Only families whose decoder layers keep to their own cache layer
(``Family.layer_major``) are read so; tests/test_gguf_stream.py holds the rows of
a streamed run to the in-memory run's, bit for bit, on a tiny file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from harness.lazy import lazy
from harness.families._gguf_import import Trace, layer_key_for
from harness.gguf.tensors import place, set_param, dequantize, param_tensor

torch = lazy("torch")

ENV = "CONFORMANCE_GGUF_STREAM"  # "1": always read layer by layer, "0": never; unset: when the model would not fit


def wanted(family, n_params: int, budget: int) -> bool:
    """Whether a file's model is read layer by layer: ``CONFORMANCE_GGUF_STREAM``
    where set, else where its float32 weights would take more than 40% of the
    memory budget (harness/budget.py ``available``) -- and only for a family whose
    layers may run so (``Family.layer_major``)."""
    env = os.environ.get(ENV, "").strip()
    if not getattr(family, "layer_major", False):
        return False
    if env in ("0", "1"):
        return env == "1"
    return n_params * 4 > 0.4 * budget


@contextmanager
def params_on_meta():
    """Modules built in the block register their parameters on the meta device
    (buffers stay where they are made): what accelerate's ``init_empty_weights``
    does without its buffers."""

    old = torch.nn.Module.register_parameter

    def register(module, name, param):
        old(module, name, param)
        if param is not None:
            p = module._parameters[name]
            kwargs = dict(p.__dict__)
            kwargs["requires_grad"] = p.requires_grad
            module._parameters[name] = type(p)(p.to(torch.device("meta")), **kwargs)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = old


class Streamed:
    """The units of ``model`` (parameters on meta) and how to read each from the file."""
    def __init__(self, family, model, config, variant, path: str, tensors: dict, shapes: dict, reader,
                 provenance: dict):
        self.family, self.model, self.config, self.path = family, model, config, path
        self.reader = reader
        # each file tensor's loader, served from what ``_read`` dequantized ahead (two threads:
        # ggml's dequantizer runs without the GIL) where it did
        self._raw = dict(tensors)
        self._ready: dict = {}
        self._pool = None
        tensors = {g: (lambda g=g, f=f: self._ready.pop(g) if g in self._ready else f()) for g, f in tensors.items()}
        self._loaders = tensors
        prepared = family.gguf_import_prepare(dict(tensors), config)
        self.trace = Trace(family, prepared, model, config, variant, path, memo={},
                           layer_key=layer_key_for(family, config, variant))
        self.trace.check(shapes, provenance)
        self.params = dict(self.trace.params)  # HF name -> Parameter (the tied head not among them)
        self.shapes = {n: tuple(p.shape) for n, p in self.params.items()}
        owner = {id(p): n for n, p in self.params.items()}
        self.layers = list(family.decoder_layers(model))
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        units = self.layers + [m for m in (emb, head) if m is not None]
        # a unit: its parameters' HF names (a tied head's weight is the embedding's: one unit)
        self.names: dict[int, list[str]] = {}
        for u in units:
            self.names[id(u)] = sorted({owner[id(p)] for p in u.parameters() if id(p) in owner})
        in_units = {n for ns in self.names.values() for n in ns}
        self.units = {id(u): u for u in units}
        self.layer_ids = {id(u) for u in self.layers}
        self.resident: list = []  # units held now, oldest first
        # the rest (norms, a head's bias): read once, held
        self._read([n for n in self.params if n not in in_units])
        self.reads = 0  # units read from the file (tests / the benchmark count them)
        self.row_reads = 0  # embedding lookups served from the rows read for them (_rows_of)

    # ------------------------------------------------------------ reading
    def _read(self, names) -> None:
        ahead = sorted({g for n in names for g, _ in self.trace.pieces[n] if g in self._raw})
        if len(ahead) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gguf-read")
            self._ready.update(zip(ahead, self._pool.map(lambda g: self._raw[g](), ahead)))
        used: set = set()
        try:
            state = {n: self.trace.tensor(n, self.params[n], used) for n in names}
        finally:
            self._ready.clear()
        place(self.model, state, self.path)
        self._give_back_pages(used)

    def _give_back_pages(self, gguf_names) -> None:
        """The mapped file's pages of those tensors dropped from this process (they stay
        in the page cache): read once, not held."""
        mm = getattr(getattr(self.reader, "mm", None), "_mmap", None)
        if mm is None or not hasattr(mm, "madvise"):
            return
        page = mmap.PAGESIZE
        for t in self.reader.tensors:
            if t.name in gguf_names:
                lo = t.data_offset - t.data_offset % page
                try:
                    mm.madvise(mmap.MADV_DONTNEED, lo, t.data_offset + t.n_bytes - lo)
                except (OSError, ValueError):
                    pass

    def held(self, module) -> bool:
        return id(module) in self.units and all(self.params[n].device.type != "meta" for n in self.names[id(module)])

    def ensure(self, module) -> None:
        """``module`` (a unit) holds its weights; an earlier decoder layer is dropped."""
        if id(module) not in self.units:
            return
        if self.held(module):
            if module in self.resident:
                self.resident.remove(module)
            self.resident.append(module)
            return
        if id(module) in self.layer_ids:
            for other in [u for u in self.resident if id(u) in self.layer_ids]:
                self.release(other)
        self._read(self.names[id(module)])
        self.reads += 1
        self.resident.append(module)

    def release(self, module) -> None:
        for n in self.names.get(id(module), ()):
            p = self.params[n]
            if p.device.type != "meta":  # (back to its own shape: an embedding held only some rows)
                set_param(p, torch.empty(self.shapes[n], dtype=p.dtype, device="meta"))
        if module in self.resident:
            self.resident.remove(module)

    def release_all(self) -> None:
        for u in list(self.resident):
            self.release(u)
        _trim()

    @contextmanager
    def holding(self, module):
        """``module`` held for the block (and dropped after, where it was not held before)."""
        was = self.held(module)
        self.ensure(module)
        try:
            yield
        finally:
            if not was:
                self.release(module)

    @contextmanager
    def shaped(self, module):
        """``module``'s parameters given storage of their shapes and no values (nothing
        read from the file) for the block, where they are not held: for what reads
        only names and shapes (the features' weight names)."""

        if self.held(module):
            yield
            return

        for n in self.names.get(id(module), ()):
            p = self.params[n]
            set_param(p, torch.empty(p.shape, dtype=p.dtype))
        try:
            yield
        finally:
            self.release(module)

    def install(self, skip=None, flush=None) -> list:
        """Forward pre-hooks reading each unit before it computes, put FIRST among the
        module's pre-hooks (registered last by the capture, prepended), so every other
        hook -- the float64 widening, the probes -- sees the weights. ``skip(module)``:
        a module the capture does not compute (nothing read for it). ``flush()``: called
        before a module is read (and an earlier layer dropped): the float64 run's
        layer left widened is narrowed back first (float64.py ``promoted``), so the
        layer dropped is the one this reading holds."""
        def pre(mod, args, kwargs):
            if skip is None or not skip(mod):
                if flush is not None and id(mod) in self.layer_ids and not self.held(mod):
                    flush()
                self.ensure(mod)

        emb = self.model.get_input_embeddings()
        rows = self._rows_of(emb)
        hooks = []
        for u in self.units.values():
            # (a tied head is a unit of its own whose one name is the embedding's weight)
            hooks.append(u.register_forward_pre_hook(rows if u is emb and rows else pre, with_kwargs=True,
                                                     prepend=True))
        return hooks

    def _rows_of(self, emb):
        """A pre-hook making ``emb`` hold only the rows a call looks up and the call look
        them up there (the ids renumbered into them), or None where that is not the same
        computation: a plain ``torch.nn.Embedding`` (a gather, no arithmetic: its rows of
        a table of those rows ARE its rows of the whole table) whose weight is no tied
        head's and is the file's tensor as it lies (one piece, laid out as HF's). An
        8B-class vocabulary's whole table took 6 s to read for each capture, for 24 rows."""

        head = self.model.get_output_embeddings()
        if (type(emb) is not torch.nn.Embedding or emb.max_norm is not None
                or (head is not None and getattr(head, "weight", None) is emb.weight)):
            return None
        name = next(iter(self.names.get(id(emb), ())), None)
        if name is None or len(self.names[id(emb)]) != 1:
            return None
        pieces = self.trace._indices(name, self.params[name])
        g = pieces[0][0]
        info = next((t for t in self.reader.tensors if t.name == g), None)
        if (len(pieces) != 1 or pieces[0][1] is not None or info is None or self.trace.tensors.get(g) is not self._loaders.get(g)
                or info.data.shape[0] != self.shapes[name][0]):
            return None
        p = self.params[name]

        def hook(mod, args, kwargs):
            ids = args[0] if args else kwargs["input"]
            want, where = np.unique(ids.detach().cpu().numpy(), return_inverse=True)
            arr = dequantize(np.ascontiguousarray(info.data[want]), info.tensor_type).reshape(len(want), -1)
            set_param(p, param_tensor(self.family.gguf_value_unmap(name, arr, self.config)))
            self.row_reads += 1
            if mod not in self.resident:
                self.resident.append(mod)
            self._give_back_pages({g})
            new = torch.from_numpy(where.reshape(tuple(ids.shape))).to(device=ids.device, dtype=ids.dtype)
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "input": new})

        return hook


def _trim() -> None:
    """The memory freed handed back to the system (glibc's ``malloc_trim``): tensors under
    glibc's mmap threshold come from the heap, and those of HF's calls, each in a thread
    of its own (layer_major.py), from arenas of their own -- freed but held, a 1B-class
    file's capture kept 0.75 GB of it and an 8B-class one's 3.5 GB while llama.cpp's
    worker ran. Nothing where the C library has no such call."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
