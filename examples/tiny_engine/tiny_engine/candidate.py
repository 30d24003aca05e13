"""The tiny engine as a harness candidate: ONE method, ``run_layer``.

Registered by this package's pyproject.toml::

    [project.entry-points."attn_conformance.candidates"]
    tiny-engine = "tiny_engine.candidate:TinyEngine"

after which ``conformance run --family llama --candidate tiny-engine --ref all``
judges it layer by layer against HF and llama.cpp.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from harness.candidates import LayerCall, LayerCandidate

from . import DTYPES, layer, unsupported


class TinyEngine(LayerCandidate):
    description = "examples/tiny_engine: llama-style attention from scratch in NumPy (an example plug-in)"
    bug: str | None = None

    def unsupported(self, run):
        if run.case.dtype not in DTYPES:
            return f"{self.name} computes in {', '.join(DTYPES)}, not {run.case.dtype}"
        for i, lc in enumerate(run.layer_cfgs):
            cfg = dataclasses.asdict(lc) if dataclasses.is_dataclass(lc) else {"shape": type(lc).__name__}
            why = unsupported(cfg, run.weights_for("float32")[i])
            if why:
                return f"{self.name} does not compute layer {i}'s {why}"
        return None

    def run_layer(self, call: LayerCall) -> dict:
        # each sequence in one call: the rows per call (call.chunks) and the KV backing
        # (call.kv) change nothing this engine computes
        cfg = dataclasses.asdict(call.config)
        per_seq = [layer(cfg, call.weights, x, call.dtype, self.bug) for x in call.inputs]
        return {p: np.stack([s[p] for s in per_seq]) for p in per_seq[0]}


class TinyEngineRopeBug(TinyEngine):
    """The same engine with a classic bug planted: RoPE on adjacent pairs where
    the model rotates halves (NeoX). The harness names q_rope as where it diverges."""

    description = "examples/tiny_engine with a planted bug: RoPE on interleaved pairs instead of NeoX halves"
    bug = "rope-interleaved"
