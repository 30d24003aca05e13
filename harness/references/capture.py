"""What a reference hands back: one capture of probes (``harness/references/hf/capture.py``,
``harness/references/llamacpp/capture.py``), or the error that stopped it. Its own module so
the references and the case that consumes them import it without importing
each other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RefCapture:
    name: str
    dtype: str  # the precision the reference computed in
    probes: dict = field(default_factory=dict)
    error: str | None = None
    meta: dict = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False
    key: str = ""  # the cache key it was stored under (an oracle forced by it keys on it)
