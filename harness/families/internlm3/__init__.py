"""internlm3: InternLM3 is llama in transformers 5 (HF ``InternLM3Config``,
transformers/models/internlm3/modular_internlm3.py, built as
``LlamaForCausalLM``: auto/modeling_auto.py maps ``internlm3`` to it; llama.cpp
arch ``llama``, ``src/models/llama.cpp``).

What the config adds to llama's: ``head_dim`` defaults to 128 (not hidden /
heads), and ``qkv_bias`` / ``bias`` are aliases of ``attention_bias`` /
``mlp_bias`` (``attribute_map``), which must be equal
(``InternLM3Config.validate_architecture``: llama has one bias switch for all
four projections).

The converter: a transformers 5 checkpoint saves ``architectures =
["LlamaForCausalLM"]`` with llama's tensor names, so convert_hf_to_gguf runs
``LlamaModel`` (conversion/llama.py: Q/K rows permuted per head, TextModel's
keys plus vocab size and rope dimension count); the hub checkpoints'
``InternLM3ForCausalLM`` runs ``InternLM3Model`` (conversion/internlm.py:
the same permutation, the same keys, arch llama). llama.cpp's llama graph
loads every bias optionally (``create_tensor_qkv``, ``wo_b``, the FFN biases).

Tiny config: head_dim 16 (= 64 / 4; a test runs head_dim 8, which the file
carries as key_length), no biases (InternLM3-8B's); ``--set
attention_bias=true --set mlp_bias=true`` runs three-way with all six biases.
"""

from __future__ import annotations

from ..llama import Llama


class InternLM3(Llama):
    name = "internlm3"
    hf_model_type = "internlm3"
    description = "llama with head_dim as its own key and one bias switch for attention and MLP"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False, mlp_bias=False,  # InternLM3Config.validate_architecture: equal
        pad_token_id=0, bos_token_id=1, eos_token_id=2,  # the defaults (2 / 1 / 2) fit; named for --gguf
        tie_word_embeddings=False,
    )
    gguf_arch = "llama"


FAMILY = InternLM3()
