"""Driving one layer over whole sequences: the engine's callers of the body.

The spec's callers (``forward_token``, ``forward_multi_seq``,
``forward_token_paged``) differ in WHERE rows live and in HOW MANY rows a call
carries. Both are parameters here:

- ``kv_mode``: ``decode`` (each sequence alone, contiguous), ``batched`` (the
  sequences advance together, each with its own contiguous cache) or ``paged``
  (the sequences advance together over one shared page pool, pages reserved
  before each push); ``evict``: the contiguous caches drop the rows a windowed
  layer can no longer read (the spec's ``evict_layer_kv`` / ``FRINK_KV_WINDOW``,
  off by default).
- ``chunks``: the rows each call carries, one list of chunk sizes per sequence
  (``None``: each whole sequence in one call); ``arrivals``: the call at which
  each sequence joins a batched run (``None``: all at the first). Sequences of
  different lengths, first calls and arrivals are continuous batching: a
  sequence joins the running batch and leaves it when its rows are done, and a
  paged sequence that leaves while another is still to join gives its pages
  back to the pool (``PagePool.release``), as a server frees a finished
  request's cache. Which sizes a case runs is the case's business
  (``harness.schedule``), not the implementation's.
"""

from __future__ import annotations

import numpy as np

from . import kv as kvmod
from .attention import Layer
from .config import ConfigError
from .trace import Trace
from .mla import MlaLayer
from .recurrent import RecurrentLayer
from .recurrent_kinds import RECURRENT_KINDS


def load_layer(cfg, weights: dict, backend):
    """The resident layer for a description (``contract.layers``,
    ``contract.recurrent``): the body its kind names in ``LOADERS`` -- the
    attention body for a ``LayerConfig``, the MLA body for an ``MlaConfig``, the
    one recurrent body for a ``RecurrentConfig`` of every recurrent kind."""

    loaders = {"attention": Layer, "mla": MlaLayer, **{k: RecurrentLayer for k in RECURRENT_KINDS}}
    kind = getattr(cfg, "kind", None)
    if kind not in loaders:
        raise ConfigError(f"impl has no body for a layer of kind {kind!r}; valid: {', '.join(loaders)}")
    return loaders[kind].load(cfg, weights, backend)


def run_layer(layer, inputs: list[np.ndarray], kv_mode: str = "decode", chunks=None,
              page_size: int = 4, trace: bool = True, seed: int = 0, evict: bool = False, arrivals=None,
              source=None):
    """Run ``inputs`` (one ``[tokens, hidden]`` array per sequence) through one layer,
    ``chunks[s]`` the rows of each call of sequence ``s`` (``None``: one call per sequence),
    sequence ``s`` joining a batched run at call ``arrivals[s]`` (``None``: every one at call 0).

    ``source``: for a layer that reads another layer's K/V (``LayerConfig.kv_source``), that
    layer and ITS inputs, ``(source_layer, source_inputs)``: the source runs call by call
    beside this layer, in the same backing (its own pages in paged mode), and this layer
    reads the source's rows after the source's push of the same call -- as a model runs its
    layers in order within one call (HF ``Gemma3nTextModel.forward``; llama.cpp's graph).
    The source's own outputs are its own layer's business and are not returned.

    Returns ``(outputs, traces, caches)``: the branch per sequence (``None`` for
    an absent layer), a ``Trace`` per sequence (or ``None``), and the KV steps
    (so a caller can measure what the cache holds).
    """
    if kv_mode not in kvmod.KV_MODES:
        raise ConfigError(f"unknown kv mode {kv_mode!r}; valid: {', '.join(kvmod.KV_MODES)}")
    if evict and kv_mode == "paged":
        raise ConfigError("KV eviction applies to the contiguous backings (decode, batched); the paged pool keeps "
                          "its pages (spec evict_layer_kv is in the contiguous arm)")
    be = layer.backend
    n_seq = len(inputs)
    lengths = [x.shape[0] for x in inputs]
    if chunks is not None and len(chunks) != n_seq:
        raise ConfigError(f"{len(chunks)} chunk plans for {n_seq} sequences; give one list of chunk sizes per sequence")
    plans = [_plan(None if chunks is None else chunks[s], t) for s, t in enumerate(lengths)]
    if arrivals is None:
        arrivals = [0] * n_seq
    arrivals = [int(a) for a in arrivals]
    if len(arrivals) != n_seq or any(a < 0 for a in arrivals):
        raise ConfigError(f"arrivals {arrivals} must be one non-negative call index per sequence ({n_seq})")
    if kv_mode == "decode" and any(arrivals):
        raise ConfigError("kv mode decode runs each sequence alone; arrivals apply to batched and paged runs")
    traces = [Trace(be) if trace else None for _ in range(n_seq)]
    src_layer, src_inputs = _check_source(layer, source, lengths, evict)
    if src_layer is None:
        steps = _make_steps(layer, kv_mode, lengths, page_size, seed, evict)
    else:  # the source's steps, each read through a Shared one (impl.kv.Shared)
        src_steps = _make_steps(src_layer, kv_mode, lengths, page_size, seed, evict)
        steps = [kvmod.Shared(st) for st in src_steps]
    outs: list[list] = [[] for _ in range(n_seq)]

    def push(lay, step, x, size: int, pos: int | None, tr):
        if isinstance(step, kvmod.Paged) and lay.has_kv():
            step.pool.reserve(step.seq, size)  # before the push, as the spec requires
        if pos is not None:
            step.pos = pos
        return lay.block(x, step, tr)

    def one(s: int, start: int, size: int, pos: int | None = None):
        x = be.asarray(inputs[s][start : start + size])
        if src_layer is not None:
            # the source's call first (its push), at the position this call starts at
            steps[s].pos = kvmod.query_start(src_steps[s]) if pos is None else pos
            push(src_layer, src_steps[s], be.asarray(src_inputs[s][start : start + size]), size, pos, None)
            branch, _ = layer.block(x, steps[s], traces[s])
        else:
            branch, _ = push(layer, steps[s], x, size, pos, traces[s])
        outs[s].append(None if branch is None else be.to_numpy(branch))

    if kv_mode == "decode":
        for s in range(n_seq):  # each sequence alone, start to end
            start = 0
            for size in plans[s]:
                one(s, start, size)
                start += size
    else:  # the sequences advance together, call by call; sequence s joins at call arrivals[s]
        starts = [0] * n_seq
        last = max(a + len(p) for a, p in zip(arrivals, plans))
        for call in range(last):
            batch = [(s, starts[s], plans[s][call - arrivals[s]]) for s in range(n_seq)
                     if arrivals[s] <= call < arrivals[s] + len(plans[s])]
            # the batch's query positions, one per sequence, as an engine's scheduler hands
            # them to the kernel (llama_batch.pos): each sequence's own row count so far
            batch_pos = [start for _, start, _ in batch]
            for j, (s, start, size) in enumerate(batch):
                one(s, start, size, batch_pos[j])
                starts[s] += size
            for s, _, _ in batch:
                done = starts[s] == lengths[s]
                held = steps[s].source if isinstance(steps[s], kvmod.Shared) else steps[s]
                if done and isinstance(held, kvmod.Paged) and any(a > call for a in arrivals):
                    # it left the batch and another is still to join: its pages go back to the pool
                    held.pool.release(held.seq)
    outputs = [None if o[0] is None else np.concatenate(o, axis=0) for o in outs]
    return outputs, traces, steps


def _check_source(layer, source, lengths: list[int], evict: bool):
    """``(source_layer, source_inputs)`` for a layer that reads another layer's K/V, checked
    (``(None, None)`` for one that reads its own): one line naming what does not fit."""
    reads = getattr(layer.cfg, "kv_source", None) is not None
    if source is None:
        if reads:
            raise ConfigError(f"the layer reads layer {layer.cfg.kv_source}'s K/V (kv_source) but no source layer "
                              "was given; valid: source=(the source layer, its inputs)")
        return None, None
    if not reads:
        raise ConfigError("a source layer was given to a layer that projects its own K/V; valid: source only with "
                          "LayerConfig.kv_source set")
    src_layer, src_inputs = source
    if not src_layer.has_kv():
        raise ConfigError("the source of a kv_source layer must keep K/V rows of its own (a gqa layer without "
                          "kv_source)")
    if src_layer.kv_row_shapes() != layer.kv_row_shapes():
        raise ConfigError(f"the source layer's K/V rows are {src_layer.kv_row_shapes()}, this layer attends over "
                          f"{layer.kv_row_shapes()} (n_kv_heads, head_dim / v_head_dim); valid: the same shapes")
    if [x.shape[0] for x in src_inputs] != lengths:
        raise ConfigError(f"the source layer's inputs have {[x.shape[0] for x in src_inputs]} rows per sequence, "
                          f"this layer's {lengths}; valid: the same sequences")
    if evict:
        # the source would drop rows after its own read that this call's reader still needs
        raise ConfigError("KV eviction with a layer reading another layer's K/V (kv_source): the source evicts "
                          "after its own read; valid: evict off")
    return src_layer, src_inputs


def _plan(chunks, n_rows: int) -> list[int]:
    if chunks is None:
        return [n_rows]
    sizes = [int(c) for c in chunks]
    if any(c < 1 for c in sizes) or sum(sizes) != n_rows:
        raise ConfigError(f"chunk sizes {sizes} must be positive and sum to the sequence's {n_rows} rows")
    return sizes


def _make_steps(layer, kv_mode: str, lengths: list[int], page_size: int, seed: int, evict: bool = False):
    be = layer.backend
    if kv_mode == "paged":
        if page_size < 1:
            raise ConfigError(f"page size must be >= 1, got {page_size}")
        # a layer without KV rows (absent; recurrent, whose state is in each sequence's
        # slot, impl.kv.recurrent_slot) gets an empty pool: nothing to reserve
        n_pages = sum(-(-t // page_size) for t in lengths) + 1 if layer.has_kv() else 0
        k_shape, v_shape = layer.kv_row_shapes() if layer.has_kv() else ((1,), None)
        pool = kvmod.PagePool(be, n_pages, page_size, k_shape, v_shape, seed=seed)
        return [kvmod.Paged(kvmod.PagedSeq([]), pool) for _ in lengths]
    variant = kvmod.KV_MODES[kv_mode]
    return [variant(kvmod.ContiguousKv(be, evict=evict)) for _ in lengths]
