"""A case's schedule: how many rows each call carries.

The schedule belongs to the case, not to the implementation under test or to a
reference: the case turns its ``--schedule`` into chunk sizes here, and hands
the SAME sizes to impl's runner (``impl.runner.run_layer(chunks=...)``) and to
llama.cpp's decode plan (``harness.references.llamacpp.capture.plan_calls``), so neither side
borrows the other's reading of it.
"""

from __future__ import annotations

from contract.errors import ConfigError

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
