"""The implementation under test: the attention half of a decoder layer,
DeepSeek-style multi-head latent attention and the recurrent layer kinds hybrid
models put in attention's place, written once over an array namespace (NumPy,
or torch on cpu/cuda/mps). Knows nothing of the harness."""

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
)
from .kv import KV_MODES, Batched, ContiguousKv, Decode, Paged, PagedSeq, PagePool, RecurrentState, recurrent_slot
from .mla import MLA_FORMS, MlaConfig, MlaLayer, MlaYarn, mla_block
from .recurrent import RECURRENT_PROBES, RECURRENT_STATES, RECURRENT_WEIGHTS, RecurrentLayer, recurrent_block
from .recurrent_kinds import RECURRENT_KINDS, RecurrentConfig, lightning_slopes
from .rope import make_rope
from .trace import LAYER_PROBES, MODEL_PROBES, Trace
