"""starcoder2: biases everywhere (q/k/v/o), LayerNorm with bias (HF
``Starcoder2ForCausalLM``, transformers/models/starcoder2/modeling_starcoder2.py;
llama.cpp ``src/models/starcoder2.cpp``).

The attention half (``Starcoder2DecoderLayer.forward``): ``nn.LayerNorm`` input
norm (mean-centred, weight AND bias, ``norm_epsilon``), q/k/v/o projections
with biases (``use_bias``), neox RoPE, scale ``head_dim ** -0.5``, the o_proj
output (with its bias) added to the residual. When ``sliding_window`` is set
HF applies it to EVERY layer (``create_sliding_window_causal_mask`` chosen once
for the model; every attention passes ``sliding_window=config.sliding_window``).

llama.cpp: NEOX RoPE, ``build_norm(..., attn_norm, attn_norm_b, LLM_NORM)``,
``build_attn(..., wo, wo_b, ...)`` -- but starcoder2.cpp names no ``attn_out``,
so the o_proj output is not exposed there (``ffn_inp``, the residual after it,
is). The converter (conversion/starcoder.py ``StarCoder2Model``) is TextModel's
with no transforms; llama.cpp requires every bias (``use_bias=False`` does not
load).

Configs:
- default: no sliding window; both references agree.
- HF-only: ``--set sliding_window=4``. llama.cpp's starcoder2 has no sliding
  window at all (no GGUF key is read, ``swa_type`` stays NONE and
  ``build_attn_inp_kv`` asserts it), so every probe from the first windowed
  softmax on differs: a ``[[finding]]``.
"""

from __future__ import annotations

from contract.layers import WindowSpec

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, text_model_gguf_params

WINDOW_4 = (("sliding_window", 4),)  # the HF-only config, as overrides


class Starcoder2(LlamaLike):
    name = "starcoder2"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta", "window")}
    hf_model_type = "starcoder2"
    description = "q/k/v/o biases, LayerNorm with bias"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        norm_epsilon=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        sliding_window=None, use_bias=True,  # llama.cpp requires the biases
        bos_token_id=1, eos_token_id=2,  # the defaults (50256) lie outside a 128-token vocab
        tie_word_embeddings=True,
    )
    gguf_arch = "starcoder2"
    extra_settable = ()  # Starcoder2Attention: head_dim = hidden_size // num_attention_heads, always
    weight_map = {**LlamaLike.weight_map, "input_layernorm.bias": "attn_norm_b"}
    # starcoder2.cpp has no cb for the o_proj output
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"}
    input_norm_kind = "layer"  # nn.LayerNorm(eps=norm_epsilon)

    def norm_eps(self, config) -> float:
        return config.norm_epsilon

    def head_dim(self, config) -> int:
        return config.hidden_size // config.num_attention_heads  # Starcoder2Attention.__init__

    def window(self, config, i: int):
        # Starcoder2Model.forward: one mask function for every layer
        sw = getattr(config, "sliding_window", None)
        return WindowSpec("sliding", int(sw)) if sw else None

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/starcoder.py StarCoder2Model: TextModel.set_gguf_parameters
        # only (layer_norm_epsilon from `norm_epsilon`; no sliding window key)
        text_model_gguf_params(w, config)


    def config_from_gguf(self, meta, shapes, tensors):
        # starcoder2.cpp load_arch_hparams: layer_norm_eps only (no sliding window:
        # HF's sliding_window stays off); load_arch_tensors requires every bias
        kw = llama_like_config(self, meta, shapes, read_hparams(meta))
        kw.update(norm_epsilon=meta.get_f32("attention.layer_norm_epsilon"), sliding_window=None,
                  use_bias="blk.0.attn_q.bias" in shapes)
        return kw


FAMILY = Starcoder2()
