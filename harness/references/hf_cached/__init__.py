"""HF transformers on its OWN cached path, on the case's schedule (``--ref hf_cached``).

The ``hf`` reference runs HF's model as one forward without a cache; impl and
llama.cpp run the case's schedule (prefill, one row per call, mixed chunks,
``5,1,1``). This reference runs HF the way a generation loop does: each call a
forward of the schedule's next chunk of every sequence with ``use_cache=True``
and the cache the previous call returned (harness/references/hf/capture.py,
``calls``) -- the path where engines break most (prefill vs decode state
handling, chunked vs per-row scans, a conv state off by a row). Its probes are
HF's as the ``hf`` reference reads them, call by call and put together, plus
the recurrent layers' state after every call from the cache
(``conv_states[..., 1:]``, ``recurrent_states``).

It is judged against HF's full forward (reference vs reference rows, in every
case that runs both) and is, like ``hf``, its own float64 oracle: a
lower-precision case judges impl against it through HF's cached path in
float64 on the same calls, teacher-forced on its own layer inputs. Where HF's
cached path computes another model than its full forward, that is HF's own
divergence: a finding with its measured size (docs/reference/divergences.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from contract.probes import STATE_PROBES

from ..hf import HF
from ...schedule import chunk_sizes

# HF's cache holds ONE length for the whole batch (cache_utils DynamicCache / the
# linear-attention layers' conv_states / recurrent_states are [batch, ...] updated by
# every forward), so it cannot run a ragged plan -- sequences joining at later calls
# with prefills of their own. This reference runs a ragged case's sequences in
# lockstep on the case's schedule instead: every row it computes is still HF's cached
# path at that row, but its states after each call are not states after the ragged
# plan's calls, so they are not exposed there.
RAGGED_STATES = ("HF's cache holds one length per batch: on a ragged plan this reference runs the sequences in "
                 "lockstep, so its per-call states are not the ragged calls' states")


class _Without(Mapping):
    """A capture's probes without some keys (the store stays lazy)."""
    def __init__(self, probes, drop):
        self._p, self._drop = probes, drop

    def __getitem__(self, k):
        if self._drop(k):
            raise KeyError(k)
        return self._p[k]

    def __iter__(self):
        return (k for k in self._p if not self._drop(k))

    def __len__(self):
        return sum(1 for _ in self)


class HFCached(HF):
    label = "HF transformers, cached path on the case's schedule"
    cached = True
    model_of = "hf"  # HF's model, computed call by call: HF's findings against llama.cpp hold for it too

    def schedule_refusal(self, family, config, chunks: tuple[int, ...]) -> str | None:
        """Where HF's cached path crashes on the schedule, as the family declares it
        (``hf_cached_schedule_refusal``)."""
        return family.hf_cached_schedule_refusal(config, chunks)

    def calls(self, req) -> list[int]:
        """The case's schedule: the same chunk sizes impl's runner and llama.cpp are handed."""
        return chunk_sizes(req.case.schedule, int(req.tokens.shape[1]))

    def not_exposed(self) -> dict[str, str]:
        return {}

    def capture(self, req, *args, **kwargs):
        rc = super().capture(req, *args, **kwargs)
        if getattr(req.case, "ragged", False) and not rc.error:
            rc.probes = _Without(rc.probes, lambda k: k.rpartition(".")[2] in STATE_PROBES)
            rc.meta = dict(rc.meta, not_exposed={**(rc.meta.get("not_exposed") or {}),
                                                 **{p: RAGGED_STATES for p in STATE_PROBES}})
        return rc
