"""The implementation under test: the attention half of a decoder layer,
DeepSeek-style multi-head latent attention and the recurrent layer kinds hybrid
models put in attention's place, written once over an array namespace (NumPy,
or torch on cpu/cuda/mps). Knows nothing of the harness; its layer descriptions
are the contract's (``contract.layers``, ``contract.recurrent``), re-exported here."""

from .attention import LAYER_WEIGHTS, Layer, attend, attn_block
from .backend import BACKENDS, DEVICES, DTYPES, Backend
from .config import (
    ConfigError,
    LayerConfig,
    NormSpec,
    QkNormSpec,
    RopeSpec,
    TemperatureSpec,
    WindowSpec,
    alibi_slopes,
    lowest_visible,
    softmax_scale,
)
from .kv import KV_MODES, Batched, ContiguousKv, Decode, Paged, PagedSeq, PagePool, RecurrentState, recurrent_slot
from .mla import MLA_FORMS, MlaConfig, MlaLayer, MlaYarn, kq_scale, mla_block, mla_yarn
from .recurrent import RECURRENT_PROBES, RECURRENT_STATES, RECURRENT_WEIGHTS, RecurrentLayer, recurrent_block
from .recurrent_kinds import RECURRENT_KINDS, RecurrentConfig, head_index, lightning_slopes, query_scale
from .rope import make_rope
from .trace import LAYER_PROBES, MODEL_PROBES, Trace

__all__ = [
    "BACKENDS", "DEVICES", "DTYPES", "KV_MODES", "LAYER_PROBES", "LAYER_WEIGHTS", "MLA_FORMS", "MODEL_PROBES",
    "RECURRENT_KINDS", "RECURRENT_PROBES", "RECURRENT_STATES", "RECURRENT_WEIGHTS", "Backend", "Batched",
    "ConfigError", "ContiguousKv", "Decode", "Layer", "LayerConfig", "MlaConfig", "MlaLayer", "MlaYarn", "NormSpec",
    "Paged", "PagePool", "PagedSeq", "QkNormSpec", "RecurrentConfig", "RecurrentLayer", "RecurrentState", "RopeSpec",
    "TemperatureSpec", "Trace", "WindowSpec", "alibi_slopes", "attend", "attn_block", "head_index", "kq_scale",
    "lightning_slopes", "lowest_visible", "make_rope", "mla_block", "mla_yarn", "query_scale", "recurrent_block",
    "recurrent_slot", "softmax_scale",
]
