"""Arrays in torch's CPU allocator's memory: a parameter set from one (gguf/tensors.py
``place``) takes it without a copy. Its own module because both the GGUF reader
(harness/gguf/) and the families' import traces (harness/families/_gguf_import.py)
allocate so, and the families sit below the reader in the import layers."""

from __future__ import annotations

import numpy as np

from harness.lazy import lazy

torch = lazy("torch")

ALIGN = 64  # bytes: torch's CPU allocator's alignment (c10 gAlignment), which a parameter had before


def aligned_empty(n: int, dtype=np.float32) -> np.ndarray:
    """An uninitialised array in torch's allocator's memory (``ALIGN``), which ``place``
    then takes as a parameter without copying."""

    return torch.empty(n, dtype=getattr(torch, np.dtype(dtype).name)).numpy()
