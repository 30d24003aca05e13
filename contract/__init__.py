"""What every side of a comparison agrees on, importing nothing else of this
project (import-linter holds it so: see pyproject.toml ``[tool.importlinter]``).

- ``contract.probes``: the probe vocabulary -- every probe's name, canonical
  shape and axes, in dataflow order, per layer kind and per model;
- ``contract.layers``: the layer descriptions a candidate is handed (attention,
  MLA, and a description of a layer nobody implements yet), frozen and
  validated at construction; ``contract.recurrent``: the recurrent layers'
  (gated delta-net, Kimi delta attention, short conv, Mamba, lightning);
- ``contract.rows``: a report row's columns, the statuses and their order;
- ``contract.candidate``: the candidate API (``LayerCall``, ``CandidateCapture``,
  ``NotExposed``) an outside engine implements.

impl/ uses these descriptions (it is the default candidate); the harness reads
the probe names from here, never from impl, and a test holds impl's own trace
names to this vocabulary (tests/test_contract.py).
"""

from .candidate import PROBE_SHAPES, CandidateCapture, LayerCall, NotExposed
from .errors import ConfigError
from .layers import (
    LayerConfig,
    MlaConfig,
    MlaYarn,
    NormSpec,
    QkNormSpec,
    RopeSpec,
    TemperatureSpec,
    Unimplemented,
    WindowSpec,
)
from .probes import ALL_PROBES, LAYER_PROBES, MODEL_PROBES, PROBES, Probe
from .recurrent import RECURRENT_KINDS, RecurrentConfig
from .rows import CASE_ORDER, FAILING, ROW_COLUMNS, STATUSES

__all__ = [
    "ALL_PROBES", "CASE_ORDER", "FAILING", "LAYER_PROBES", "MODEL_PROBES", "PROBES", "PROBE_SHAPES",
    "RECURRENT_KINDS", "ROW_COLUMNS", "STATUSES", "CandidateCapture", "ConfigError", "LayerCall", "LayerConfig",
    "MlaConfig", "MlaYarn", "NormSpec", "NotExposed", "Probe", "QkNormSpec", "RecurrentConfig", "RopeSpec",
    "TemperatureSpec", "Unimplemented", "WindowSpec",
]
