"""llama: the plain decoder (HF ``LlamaForCausalLM``; llama.cpp ``src/models/llama.cpp``).

GQA, neox RoPE, RMS input norm, no biases by default (``attention_bias`` turns
all four on, HF ``LlamaAttention.__init__``)."""

from .base import LlamaLike


class Llama(LlamaLike):
    name = "llama"
    hf_model_type = "llama"
    description = "plain GQA decoder, neox RoPE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    gguf_arch = "llama"


FAMILY = Llama()
