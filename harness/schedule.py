"""A case's schedule: how many rows each call carries, and for several
sequences which sequences each call carries.

The schedule belongs to the case, not to the implementation under test or to a
reference: the case turns its ``--schedule`` (and ``--ragged``) into a
``BatchPlan`` here, and hands the SAME plan to impl's runner
(``impl.runner.run_layer(chunks=..., arrivals=...)``, through
``contract.candidate.LayerCall.steps``) and to llama.cpp's decode plan
(``harness.references.llamacpp.capture.plan_calls``), so neither side borrows
the other's reading of it.

Lockstep (the default): every sequence has the case's ``tokens`` rows and the
same chunk sizes, and every call of a batched / paged case carries one chunk
of each sequence. Ragged (``--ragged``, issue 28): real serving is continuous
batching, and a batch whose sequences always sit at the same positions cannot
show a bug that mixes them up (sequence 1 taking sequence 0's query position
passes every lockstep case). So each sequence gets its own length, its own
first-call size and its own arrival -- sequence ``i`` joins the running batch
at call ``i`` with a prefill of its own size and then decodes one row per
call; some leave before others, and for three sequences or more sequence 1
leaves after its prefill, so a later arrival reuses what it released (a paged
pool's pages). Everything is drawn from the case's seed (``ragged_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.errors import ConfigError
from contract.probes import PROBES

SCHEDULES = ("prefill", "decode", "mixed")


def chunk_sizes(schedule: str, n_tokens: int) -> list[int]:
    """``prefill``: all rows in one call; ``decode``: one row per call; ``mixed``:
    the first half in one call, then one row per call; or a comma list of chunk
    sizes summing to ``n_tokens``."""
    if schedule == "prefill":
        return [n_tokens]
    if schedule == "decode":
        return [1] * n_tokens
    if schedule == "mixed":
        first = max(1, n_tokens // 2)
        return [first] + [1] * (n_tokens - first)
    try:
        sizes = [int(s) for s in schedule.split(",")]
    except ValueError:
        raise ConfigError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)} or chunk sizes like 5,1,1") from None
    if any(s < 1 for s in sizes) or sum(sizes) != n_tokens:
        raise ConfigError(f"schedule {schedule!r} must be positive chunk sizes summing to {n_tokens} tokens")
    return sizes


@dataclass(frozen=True)
class BatchPlan:
    """How a case's sequences are fed: sequence ``s`` has ``lengths[s]`` rows, fed
    ``chunks[s]`` rows per call, and joins the batch at call ``arrivals[s]``.
    ``batched``: the sequences advance together (kv batched / paged: one call
    carries the next chunk of every sequence that has joined and not finished);
    else each sequence runs alone, start to end (kv decode)."""

    lengths: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]
    arrivals: tuple[int, ...]
    batched: bool = True
    ragged: bool = False

    @property
    def n_tokens(self) -> int:
        return max(self.lengths)

    def calls(self) -> list[list[tuple[int, int, int]]]:
        """The calls in order, each ``[(seq, start, rows), ...]`` with the sequences
        ascending: what every side runs."""
        if not self.batched:
            out = []
            for s, sizes in enumerate(self.chunks):
                start = 0
                for n in sizes:
                    out.append([(s, start, n)])
                    start += n
            return out
        n_calls = max(a + len(c) for a, c in zip(self.arrivals, self.chunks))
        starts = [0] * len(self.lengths)
        out = []
        for k in range(n_calls):
            call = []
            for s, (a, sizes) in enumerate(zip(self.arrivals, self.chunks)):
                if a <= k < a + len(sizes):
                    n = sizes[k - a]
                    call.append((s, starts[s], n))
                    starts[s] += n
            out.append(call)
        return out

    def steps(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """``calls`` as ``LayerCall.steps`` gives them: per call, ``(seq, rows)``."""
        return tuple(tuple((s, n) for s, _, n in call) for call in self.calls())

    def finished_at(self, s: int) -> int:
        """The call of sequence ``s``'s last rows (batched plans)."""
        return self.arrivals[s] + len(self.chunks[s]) - 1


def batch_plan(schedule: str, n_tokens: int, n_seqs: int, kv: str, ragged: bool = False,
               seed: int = 0) -> BatchPlan:
    """The plan of a case (its ``--schedule``, ``--tokens``, ``--seqs``, ``--kv``,
    ``--ragged`` and ``--seed``)."""
    sizes = tuple(chunk_sizes(schedule, n_tokens))
    if not ragged:
        return BatchPlan((n_tokens,) * n_seqs, (sizes,) * n_seqs, (0,) * n_seqs, batched=kv != "decode")
    if kv == "decode" or n_seqs < 2:
        raise ConfigError("--ragged needs several sequences in one batch: --kv batched or paged, --seqs 2 or more")
    return ragged_plan(sizes, n_seqs, seed, prefill_only=schedule == "prefill")


def ragged_plan(first_sizes: tuple[int, ...], n_seqs: int, seed: int, prefill_only: bool = False) -> BatchPlan:
    """A continuous-batching plan, deterministic from ``seed``: sequence 0 runs
    ``first_sizes`` (the case's own schedule over its ``tokens`` rows) from call 0;
    sequence ``i >= 1`` joins at call ``i`` with a length of its own (drawn from
    ``ceil(T / 2) .. T - 1``, distinct where there are enough), a prefill of its
    own size (drawn from ``1 .. length - 1``, distinct where possible; the whole
    sequence under the ``prefill`` schedule), then one row per call. With three
    sequences or more, sequence 1 is done after its prefill, so sequence 2 joins
    after it left (continuous batching's reuse of a finished sequence's cache);
    and never do all leave at the same call."""
    t = int(sum(first_sizes))
    rng = np.random.default_rng([int(seed), int(n_seqs), t, 28])
    lo = max(1, -(-t // 2))
    pool = np.arange(lo, t) if t > 1 else np.array([1])
    lens = (rng.choice(pool, n_seqs - 1, replace=len(pool) < n_seqs - 1) if len(pool)
            else np.ones(n_seqs - 1, dtype=np.int64))
    lengths = [t] + [int(x) for x in lens]
    chunks: list[tuple[int, ...]] = [tuple(int(x) for x in first_sizes)]
    used = {chunks[0][0]}
    for s in range(1, n_seqs):
        n = lengths[s]
        if prefill_only or n == 1 or (s == 1 and n_seqs >= 3):
            first = n
        else:
            options = [p for p in range(1, n) if p not in used] or list(range(1, n))
            first = int(rng.choice(options))
        used.add(first)
        chunks.append((first,) + (1,) * (n - first))
    finish = {s + len(c) - 1 for s, c in enumerate(chunks)}
    last = chunks[-1]
    if len(finish) == 1 and len(last) > 1:  # all would leave together: the last one leaves a call early
        chunks[-1] = (last[0] + 1,) + last[2:]
    return BatchPlan(tuple(lengths), tuple(chunks), tuple(range(n_seqs)), batched=True, ragged=True)


def plan_of(case, n_tokens: int | None = None) -> BatchPlan:
    """The plan of a ``harness.case.Case`` (``n_tokens``: the length a ``--prompt``
    gave the case, when it is not ``case.tokens``)."""
    return batch_plan(case.schedule, case.tokens if n_tokens is None else n_tokens, case.n_seqs, case.kv,
                      getattr(case, "ragged", False), case.seed)


def mask(probe: str, arr, lengths) -> np.ndarray:
    """``arr`` (a probe ``[S, ...]``) with every row past sequence ``s``'s
    ``lengths[s]`` set to zero, along each of its token axes (``tok``, and
    ``key`` for the probabilities): a ragged case's sides hold different things
    there (HF runs every sequence's full forward over the case's tokens,
    llama.cpp and the candidate only each sequence's own rows), and none of it
    belongs to the case. Zeros on both sides add nothing to an NMSE or a max;
    the array is returned as it is when no sequence is short."""

    a = np.asarray(arr)
    if lengths is None or a.ndim < 2 or a.shape[0] != len(lengths):
        return a
    p = PROBES.get(probe)
    names = p.axes if p is not None and len(p.axes) == a.ndim else ("seq", "tok") + ("-",) * (a.ndim - 2)
    tok_axes = [d for d, n in enumerate(names) if n in ("tok", "key")]
    short = [s for s, n in enumerate(lengths) if any(n < a.shape[d] for d in tok_axes)]
    if not short:
        return a
    a = np.array(a)  # a copy: a capture's arrays may be read-only (memory-mapped)
    for s in short:
        for d in tok_axes:
            idx = [slice(None)] * a.ndim
            idx[0], idx[d] = s, slice(int(lengths[s]), None)
            a[tuple(idx)] = 0
    return a
