"""qwen2: llama's shape with Q/K/V biases and no o_proj bias (HF
``Qwen2Attention.__init__``: ``bias=True`` on q/k/v, ``bias=False`` on o;
llama.cpp ``src/models/qwen2.cpp``: ``bq``, ``bk``, ``bv``)."""

from ..base import LlamaLike


class Qwen2(LlamaLike):
    name = "qwen2"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta", "window")}
    hf_model_type = "qwen2"
    description = "QKV bias"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
    )
    gguf_arch = "qwen2"


FAMILY = Qwen2()
