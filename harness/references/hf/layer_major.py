"""HF's cached path, call after call, computed layer by layer.

HF's own cached path (``hf_cached``, and its float64 oracle) is one forward per
call of the schedule: every call runs every decoder layer. Where a decoder layer
must be made before it computes -- widened to float64 (``float64.promoted``),
or read from the file (a model too large to hold) -- doing that once per call
and layer was most of the run: a 1B-class file's float64 oracle widened each of
its 16 layers on each of its 33 calls.

``LayerMajor`` runs the same forwards in another ORDER. Each call's forward runs
in a thread of its own, HF's own code from the first line to the last (its
embedding, masks and rotary tables, every decoder layer, its norm and head); a
gate before each decoder layer lets the calls through layer by layer -- call 0,
1, ..., C-1 through layer i, then through layer i+1 -- with exactly one thread
running at any time. Every module is called with the arguments it is called
with one call after another (the same input, the same masks and tables, its own
cache layer holding the same earlier calls), so every probe is the same, bit for
bit; what changes is that one layer's work for all calls comes together.

What makes the order exact, and what is checked:

- a decoder layer reads and writes only its own cache layer (``Cache.update(...,
  layer_idx)``): the families that declare ``layer_major`` (harness/families),
  each with a test holding it to the call-by-call capture bit for bit;
- a call's preamble (position ids from ``get_seq_length``, the masks from
  ``get_mask_sizes`` / ``get_query_offset``) reads cache layers before its first
  decoder layer: those layers form the first group, which the calls pass
  together, one call after another, so each holds exactly the earlier calls when
  the next call reads it. Every such read is checked as it happens (``_Unsynced``
  where a layer holds other calls than the earlier ones: the caller then runs the
  calls one after another, as before).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from harness.lazy import lazy

cache_utils = lazy("transformers.cache_utils")
torch = lazy("torch")

_local = threading.local()


class _Unsynced(RuntimeError):
    """A cache layer was read while it held other calls than the reading call's
    earlier ones: the layer-major order cannot reproduce this model's calls."""


class _Aborted(BaseException):
    """Another call failed: this one unwinds (BaseException: no ``except Exception``
    of the modeling code takes it for its own)."""


class LayerMajor:
    """``run(fn)`` runs ``fn(c)`` for every call c, each in its own thread, in
    layer-major order through ``modules`` (the decoder layers, in order).
    ``on_switch(c)``: called whenever call c takes over (the capture's per-call
    state: which dict its probes go to, which rows it is)."""

    def __init__(self, modules, n_calls: int, on_switch, on_groups=None):
        self.modules = list(modules)
        self.index = {id(m): i for i, m in enumerate(self.modules)}
        self.n = n_calls
        self.on_switch = on_switch
        self.cv = threading.Condition()
        self.order: list | None = None  # ("start", c) or (c, m), the permissions in turn
        self.pos = 0
        self.holder: int | None = None
        self.error: BaseException | None = None
        self.passes = [0] * len(self.modules)  # calls that have entered module m
        self.first_group = 0  # the last module of the first group (what call 0's preamble read)
        self.results: list = [None] * n_calls
        self.on_groups = on_groups  # told the first group's last module once call 0's preamble has read

    # ------------------------------------------------------------ the baton
    def _wait_for(self, turn) -> None:
        """Block until ``turn`` is the next permission and nobody runs; take it."""
        c = turn[0] if turn[0] != "start" else turn[1]
        with self.cv:
            while True:
                if self.error is not None:
                    raise _Aborted()
                if (self.holder is None and self.order is not None and self.pos < len(self.order)
                        and self.order[self.pos] == turn):
                    break
                self.cv.wait()
            self.holder = c
            self.pos += 1
        self.on_switch(c)

    def _release(self, ended: int | None = None) -> None:
        with self.cv:
            if ended is not None:
                if self.order is None:  # call 0 ended before any decoder layer
                    self._make_order()
                # a call that ended passes no further gate: its turns are dropped, so the
                # others never wait for it
                self.order[self.pos:] = [t for t in self.order[self.pos:]
                                         if (t[1] if t[0] == "start" else t[0]) != ended]
            self.holder = None
            self.cv.notify_all()

    def gate(self, module) -> None:
        """Before a decoder layer: wait for this call's turn at it."""
        c = _local.call
        m = self.index[id(module)]
        with self.cv:
            if self.order is None:  # call 0 ends its preamble: the groups are known now
                self._make_order()
            _local.in_preamble = False
            if self.pos < len(self.order) and self.order[self.pos] == (c, m) and self.holder == c:
                self.pos += 1
                self.passes[m] += 1
                return
            self.holder = None
            self.cv.notify_all()
        self._wait_for((c, m))
        with self.cv:
            self.passes[m] += 1

    def _make_order(self) -> None:
        k = self.first_group
        groups = [list(range(min(k, len(self.modules) - 1) + 1))] if self.modules else []
        groups += [[m] for m in range(groups[0][-1] + 1 if groups else 0, len(self.modules))]
        order: list = []
        for g, ms in enumerate(groups):
            for c in range(self.n):
                if g == 0:
                    order.append(("start", c))
                order += [(c, m) for m in ms]
        self.order = order
        self.pos = 1  # call 0 has started
        if self.on_groups is not None:
            self.on_groups(groups[0][-1] if groups else -1)

    # ------------------------------------------------------------ what a preamble reads
    def read(self, layer_idx: int) -> None:
        """A cache read of layer ``layer_idx`` by the running call: call 0's preamble
        decides the first group; any other must find the layer holding exactly the
        calls before its own (and inside a decoder layer, its own call too)."""
        c = getattr(_local, "call", None)
        if c is None or not 0 <= layer_idx < len(self.passes):
            return
        if self.order is None:  # call 0, before its first decoder layer
            self.first_group = max(self.first_group, layer_idx)
            return
        if self.passes[layer_idx] not in ((c,) if _local.in_preamble else (c, c + 1)):
            raise _Unsynced(f"cache layer {layer_idx} read by call {c} after {self.passes[layer_idx]} calls")

    # ------------------------------------------------------------ running
    def _thread(self, c: int, fn) -> None:
        _local.call, _local.in_preamble = c, True
        try:
            if c == 0:
                with self.cv:
                    self.holder = 0
                self.on_switch(0)
            else:
                self._wait_for(("start", c))
            self.results[c] = fn(c)
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 -- handed to the caller of run()
            with self.cv:
                if self.error is None:
                    self.error = e
        finally:
            self._release(ended=c)

    def run(self, fn) -> list:
        """``[fn(0), ..., fn(C-1)]``; the first exception of any call is raised here."""
        grad = torch.is_grad_enabled()

        def body(c):
            with torch.set_grad_enabled(grad):  # grad mode is per thread
                self._thread(c, fn)

        # daemons: an interrupt of the main thread (Ctrl-C) must not leave the process waiting on them
        threads = [threading.Thread(target=body, args=(c,), name=f"hf-call-{c}", daemon=True) for c in range(self.n)]
        handles = [m.register_forward_pre_hook(lambda mod, args, kwargs: self.gate(mod), with_kwargs=True,
                                               prepend=True) for m in self.modules]
        try:
            with _reads_checked(self):
                for t in threads:
                    t.start()
                try:
                    for t in threads:
                        t.join()
                except BaseException as e:  # the main thread interrupted: the calls unwind
                    with self.cv:
                        self.error = self.error or e
                        self.cv.notify_all()
                    raise
        finally:
            for h in handles:
                h.remove()
        if self.error is not None:
            raise self.error
        return self.results


@contextmanager
def _reads_checked(lm: LayerMajor):
    """Every ``Cache`` method that reads a layer's state by index, checked by ``lm``
    while it runs (cache_utils ``Cache.get_seq_length`` / ``get_mask_sizes`` /
    ``get_query_offset``: what a model's preamble reads)."""

    cls = cache_utils.Cache
    saved = {}
    for name, pos in (("get_seq_length", 0), ("get_mask_sizes", 1), ("get_query_offset", 0)):
        orig = cls.__dict__.get(name)
        if orig is None:
            continue

        def wrapped(self, *args, _orig=orig, _pos=pos, _name=name, **kwargs):
            idx = args[_pos] if len(args) > _pos else kwargs.get("layer_idx", 0)
            if isinstance(idx, int):
                lm.read(idx)
            return _orig(self, *args, **kwargs)

        saved[name] = orig
        setattr(cls, name, wrapped)
    try:
        yield
    finally:
        for name, orig in saved.items():
            setattr(cls, name, orig)


def applies(family, config, layer_cfgs, calls) -> bool:
    """Whether ``calls`` of this family's model may run layer by layer: more than one
    call, a family that declares its decoder layers read only their own cache layer
    (``Family.layer_major``), one invocation per module, and no layer whose state
    the capture reads from the cache after each call (a recurrent layer's state
    after call c must not hold later calls)."""
    return (calls is not None and len(calls) > 1 and len(calls) <= MAX_CALLS
            and bool(getattr(family, "layer_major", False)) and family.invocation_order(config) is None
            and not any(getattr(lc, "has_recurrence", None) is not None for lc in layer_cfgs))


MAX_CALLS = 512  # a thread per call: longer schedules run call after call
