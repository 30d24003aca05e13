"""KV backings: where one sequence's K/V rows are written and read back.

The spec (`attn_block.rs.txt`, ``KvStep``) makes the backing a NAMED VARIANT,
not a ``paged: bool``: a tenth caller can silently forget a flag and cannot
silently forget to name a variant. Here the variants are three small classes;
``push_and_read`` is the ONLY place the backing shows through, and it hands the
one attention kernel the same arrays whichever variant holds them -- so paged
and contiguous agree bit for bit by construction, and the tests hold them to it.

- ``Decode``: one sequence, contiguous (the spec's ``forward_token``).
- ``Batched``: one sequence of several, contiguous (``forward_multi_seq``).
  Identical arithmetic to ``Decode``; a separate name so a caller that drives
  several sequences says so.
- ``Paged``: a block table over a page pool shared by every sequence of the
  layer (``forward_token_paged``). Pages are reserved by the caller BEFORE the
  push, as the spec requires ("every caller reserves this row's pages before
  the stack runs"); a push into unreserved rows is an error, not a silent grow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class KvError(RuntimeError):
    pass


class ContiguousKv:
    """One sequence's rows for one layer, in position order.

    ``positions`` is kept beside the rows because a windowed layer may evict
    its oldest rows (``evict_below``), after which row index != position.

    ``evict``: the KV option of the spec's ``evict_layer_kv`` ("a no-op unless
    ``FRINK_KV_WINDOW`` is on"), off by default. With it off the cache keeps
    every row and the kernel reads exactly the rows the paged backing reads, so
    the two agree bit for bit; with it on, a windowed layer drops the rows no
    later query can see, and the kernel's reduction runs over fewer (masked)
    rows -- the same values within rounding, not bit for bit.
    """

    def __init__(self, backend, latent: bool = False, evict: bool = False):
        self.backend = backend
        self.evict = bool(evict)
        self.k = None
        self.v = None
        self.positions = np.zeros((0,), dtype=np.int64)
        self.next_pos = 0  # positions pushed so far (the next query's position)
        self.recurrent: RecurrentState | None = None  # a recurrent layer's state (recurrent_slot)

    def push(self, k, v):
        xp = self.backend.xp
        n = k.shape[0]
        self.k = k if self.k is None else xp.concat([self.k, k], axis=0)
        if v is not None:
            self.v = v if self.v is None else xp.concat([self.v, v], axis=0)
        self.positions = np.concatenate([self.positions, np.arange(self.next_pos, self.next_pos + n)])
        self.next_pos += n

    def evict_below(self, min_pos: int) -> int:
        """Drop rows at positions < ``min_pos``; returns how many were dropped.

        Called AFTER the kernel read (spec, ``evict_layer_kv``): the rows this
        drops are rows every kernel has finished with, and the caller passes the
        same window the kernel just used.
        """
        keep = self.positions >= min_pos
        dropped = int((~keep).sum())
        if dropped:
            idx = self.backend.index(np.nonzero(keep)[0])
            xp = self.backend.xp
            self.k = xp.take(self.k, idx, axis=0)
            if self.v is not None:
                self.v = xp.take(self.v, idx, axis=0)
            self.positions = self.positions[keep]
        return dropped

    @property
    def rows(self) -> int:
        return int(self.positions.shape[0])

    def nbytes(self) -> int:
        return sum(_nbytes(a) for a in (self.k, self.v) if a is not None)


class PagePool:
    """Fixed-size pages of K/V rows for one layer, shared by every sequence.

    Pages are handed out in a scrambled (seeded, deterministic) order, so a
    kernel that ignored the block table and read pages in allocation order
    would read another sequence's rows -- a bug the comparison then sees.
    """

    def __init__(self, backend, n_pages: int, page_size: int, k_shape: tuple, v_shape: tuple | None, seed: int = 0):
        xp = backend.xp
        self.backend = backend
        self.page_size = page_size
        self.k = xp.zeros((n_pages, page_size, *k_shape), dtype=backend.native_dtype, **_dev(backend))
        self.v = None if v_shape is None else xp.zeros((n_pages, page_size, *v_shape), dtype=backend.native_dtype, **_dev(backend))
        order = np.random.default_rng(seed).permutation(n_pages)
        self.free = [int(p) for p in order]

    def reserve(self, seq: "PagedSeq", n_rows: int) -> None:
        """Make room for ``n_rows`` more rows of ``seq`` (allocate pages as needed)."""
        need = seq.seq_len + n_rows
        while seq.reserved_rows(self.page_size) < need:
            if not self.free:
                raise KvError(f"page pool exhausted: {len(seq.block_table)} pages held by this sequence, none free")
            seq.block_table.append(self.free.pop())

    def release(self, seq: "PagedSeq") -> None:
        self.free.extend(reversed(seq.block_table))
        seq.block_table.clear()
        seq.seq_len = 0
        seq.recurrent = None

    def write(self, seq: "PagedSeq", k, v) -> None:
        n = k.shape[0]
        if seq.seq_len + n > seq.reserved_rows(self.page_size):
            raise KvError(
                f"push of {n} rows at length {seq.seq_len} exceeds the {seq.reserved_rows(self.page_size)} "
                "reserved rows; reserve pages before the push"
            )
        i = 0
        while i < n:
            pos = seq.seq_len + i
            page, slot = seq.block_table[pos // self.page_size], pos % self.page_size
            m = min(n - i, self.page_size - slot)
            self.k[page, slot : slot + m, ...] = k[i : i + m, ...]
            if self.v is not None:
                self.v[page, slot : slot + m, ...] = v[i : i + m, ...]
            i += m
        seq.seq_len += n

    def gather(self, seq: "PagedSeq"):
        """The sequence's rows in position order, through its block table."""
        xp = self.backend.xp
        n_blocks = -(-seq.seq_len // self.page_size)
        idx = self.backend.index(seq.block_table[:n_blocks])

        def rows(store):
            g = xp.take(store, idx, axis=0)
            return xp.reshape(g, (n_blocks * self.page_size, *store.shape[2:]))[: seq.seq_len, ...]

        return rows(self.k), (None if self.v is None else rows(self.v))

    def nbytes_per_row(self) -> int:
        per = _nbytes(self.k) // (self.k.shape[0] * self.page_size)
        if self.v is not None:
            per += _nbytes(self.v) // (self.v.shape[0] * self.page_size)
        return per


@dataclass
class RecurrentState:
    """One sequence's state for one recurrent layer, as the body left it after its
    last call: ``conv`` the last ``K - 1`` rows that entered the causal conv
    (``[K - 1, C]``, oldest first, in the compute dtype), ``rec`` the recurrent
    matrix (``[Hv, Dk, Dv]``, in the backend's accumulation dtype), ``rows`` the
    rows seen so far. ``None`` before the first call (zeros, as HF's and
    llama.cpp's fresh caches). ``decay_residual``: for a decay that is the same
    every row (lightning), what the state's multipliers so far realised over the
    exact decay, per head (float64, host; impl.recurrent_scan.carried_decays)."""

    conv: object = None
    rec: object = None
    rows: int = 0
    decay_residual: object = None


@dataclass
class PagedSeq:
    block_table: list
    seq_len: int = 0
    recurrent: RecurrentState | None = None  # a recurrent layer's state: the sequence's, not the pool's

    def reserved_rows(self, page_size: int) -> int:
        return len(self.block_table) * page_size


# --- the named variants -----------------------------------------------------


@dataclass
class Decode:
    cache: ContiguousKv


@dataclass
class Batched:
    cache: ContiguousKv
    # this call's first query position as the batch hands it to the layer (the runner
    # sets it per call, as llama_batch.pos carries each row's position); None: the
    # sequence's own row count, the spec's query_pos
    pos: int | None = None


@dataclass
class Paged:
    seq: PagedSeq
    pool: PagePool
    pos: int | None = None  # as Batched.pos


@dataclass
class Shared:
    """A layer that reads ANOTHER layer's K/V (``LayerConfig.kv_source``, gemma3n's last
    layers): ``source`` is the source layer's step for the same sequence -- a ``Decode``,
    ``Batched`` or ``Paged`` one, so the sharing holds in every backing -- read after the
    source pushed this call's rows (HF ``Gemma3nTextModel.forward`` runs the layers in
    order, ``shared_kv_states`` filled by the source; llama.cpp reads the source's cache
    cells, llama-model.cpp ``reuse``). ``pos``: this call's first query position (the
    source's before its push; impl.runner sets it per call). Nothing is pushed."""

    source: "Decode | Batched | Paged"
    pos: int = 0


KvStep = Decode | Batched | Paged | Shared
KV_MODES = {"decode": Decode, "batched": Batched, "paged": Paged}


def query_start(kv: KvStep) -> int:
    """The position of the first row of this call: what the sequence holds BEFORE the push."""
    match kv:
        case Shared(_, pos):
            return pos  # the source's position before its push of this call
        case Batched(_, pos) | Paged(_, _, pos) if pos is not None:
            return pos  # the batch's position for this sequence (impl.runner sets it per call)
        case Decode(cache) | Batched(cache):
            return cache.next_pos
        case Paged(seq, _):
            return seq.seq_len
    raise TypeError(f"not a KV step: {kv!r}")


def recurrent_slot(kv: KvStep) -> RecurrentState:
    """The sequence's recurrent-state slot for this layer, whichever backing holds
    it (spec ``KvStep::recurrent_slot``): made empty on first use."""
    match kv:
        case Decode(holder) | Batched(holder) | Paged(holder, _):
            if holder.recurrent is None:
                holder.recurrent = RecurrentState()
            return holder.recurrent
    raise TypeError(f"not a KV step: {kv!r}")


def push_and_read(kv: KvStep, k, v):
    """Append this call's rows, then return everything the sequence holds:
    ``(k_all, v_all, key_positions)``. The only place the backing shows through.
    A ``Shared`` step pushes nothing (``k`` / ``v`` are None) and reads its source's rows."""
    match kv:
        case Shared(source):
            if k is not None or v is not None:
                raise KvError("a layer reading another layer's K/V (kv_source) pushes none of its own")
            return read(source)
        case Decode(cache) | Batched(cache):
            cache.push(k, v)
            return read(kv)
        case Paged(seq, pool):
            pool.write(seq, k, v)
            return read(kv)
    raise TypeError(f"not a KV step: {kv!r}")


def read(kv: KvStep):
    """Everything the sequence holds, without a push: ``(k_all, v_all, key_positions)``."""
    match kv:
        case Decode(cache) | Batched(cache):
            if cache.k is None:
                raise KvError("the source layer's cache is empty: run the source's call before its reader's")
            return cache.k, cache.v, cache.positions
        case Paged(seq, pool):
            k_all, v_all = pool.gather(seq)
            return k_all, v_all, np.arange(seq.seq_len, dtype=np.int64)
    raise TypeError(f"not a KV step a layer can read: {kv!r}")


def evict_layer_kv(kv: KvStep, min_pos_next: int | None) -> None:
    """Window eviction (spec ``evict_layer_kv``), AFTER the kernel read: a no-op
    unless the contiguous cache was made with ``evict`` on; then it drops the
    rows no later query can see (positions below ``min_pos_next``, the window
    the kernel just used, advanced one position). The paged pool keeps its
    pages (the spec evicts in the contiguous arm only)."""
    if min_pos_next is None:
        return
    match kv:
        case Decode(cache) | Batched(cache) if cache.evict:
            cache.evict_below(min_pos_next)


def _dev(backend):
    return {} if backend.name == "numpy" else {"device": backend.device}


def _nbytes(a) -> int:
    if hasattr(a, "nbytes"):
        return int(a.nbytes)
    return int(a.numel() * a.element_size())
