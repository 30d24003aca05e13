"""arcee: llama's attention with a ReLU^2 MLP (HF ``ArceeForCausalLM``,
transformers/models/arcee/modeling_arcee.py; llama.cpp ``src/models/arcee.cpp``;
converter conversion/llama.py ``ArceeModel(LlamaModel)``).

HF: ``ArceeAttention`` is llama's (GQA, neox RoPE, ``attention_bias`` on all
four projections, scale ``head_dim ** -0.5``); ``ArceeMLP`` is
``down_proj(relu2(up_proj(x)))`` -- no gate (the FFN half; it reaches the
attention only through the residual stream).

llama.cpp: arcee.cpp is llama's graph with ``LLM_FFN_RELU_SQR`` /
``LLM_FFN_SEQ`` and the same cb names; ``LLAMA_ROPE_TYPE_NORM``, so the
converter permutes Q/K rows as llama's does (``ArceeModel`` inherits
``LlamaModel.modify_tensors``) and writes LlamaModel's keys (plus a pooling type
only for a sentence-transformers checkpoint). ``load_arch_tensors`` creates
the optional q/k/v biases (``create_tensor_qkv``) but no ``attn_output.bias``
and no FFN biases: ``--set attention_bias=true`` gives a file llama.cpp
refuses (an error row, as for a user), so it is judged against HF alone.
"""

from __future__ import annotations

from ..llama import Llama


class Arcee(Llama):
    name = "arcee"
    hf_model_type = "arcee"
    description = "llama attention, ReLU^2 MLP without gate (no o_proj bias in llama.cpp)"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        hidden_act="relu2",  # ArceeConfig's default (AFM-4.5B)
        pad_token_id=0, bos_token_id=1, eos_token_id=2,  # the defaults (128000 / 128001) lie outside 128 tokens
        tie_word_embeddings=False,
    )
    gguf_arch = "arcee"

    def config_from_gguf(self, meta, shapes, tensors):
        # arcee.cpp load_arch_hparams: the RMS eps (GGUFImport's default); the graph's FFN is
        # always ReLU^2 without gate (LLM_FFN_RELU_SQR, LLM_FFN_SEQ): HF's hidden_act relu2
        kw = super().config_from_gguf(meta, shapes, tensors)
        kw["hidden_act"] = "relu2"
        return kw


FAMILY = Arcee()
