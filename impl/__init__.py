"""The implementation under test: the attention half of a decoder layer and
DeepSeek-style multi-head latent attention, written once over an array
namespace (NumPy, or torch on cpu/cuda/mps). Knows nothing of the harness; its
layer descriptions are the contract's (``contract.layers``), re-exported here."""

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
from .kv import KV_MODES, Batched, ContiguousKv, Decode, Paged, PagedSeq, PagePool
from .mla import MLA_FORMS, MlaConfig, MlaLayer, MlaYarn, kq_scale, mla_block, mla_yarn
from .rope import make_rope
from .trace import LAYER_PROBES, MODEL_PROBES, Trace
