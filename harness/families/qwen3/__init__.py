"""qwen3: per-head RMS QK norm before RoPE (HF ``Qwen3Attention.forward``:
``q_norm(q_proj(x).view(..., head_dim))``, "unlike olmo, only on the head dim";
llama.cpp ``src/models/qwen3.cpp``: ``attn_q_norm`` / ``attn_k_norm`` before
``ggml_rope_ext``). HF's Qwen3Config defaults head_dim to 128, so the tiny
config names it."""

from contract.layers import NormSpec, QkNormSpec

from ..base import LlamaLike


class Qwen3(LlamaLike):
    name = "qwen3"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta", "window")}
    hf_model_type = "qwen3"
    description = "per-head QK RMS norm before RoPE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
    )
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    gguf_arch = "qwen3"


FAMILY = Qwen3()
