"""mistral: llama's attention with a sliding window on every layer (HF
``MistralForCausalLM``, transformers/models/mistral/modeling_mistral.py;
llama.cpp ``src/models/llama.cpp``: convert_hf_to_gguf registers
``MistralForCausalLM`` with ``LlamaModel``, conversion/llama.py).

HF: ``MistralAttention.forward`` is llama's (GQA, neox RoPE, no biases, scale
``head_dim ** -0.5``) but passes ``sliding_window=config.sliding_window`` to
the attention ("main diff with Llama"), and ``MistralModel.forward`` builds
``create_sliding_window_causal_mask`` for EVERY layer when it is set.
``MistralConfig.sliding_window`` defaults to 4096 (Mistral-7B-v0.1's
config.json has 4096; v0.2 / v0.3 and Mistral-Nemo have null).

llama.cpp: the file is a llama file -- ``LlamaModel`` permutes Q/K rows as for
llama and writes no window key (conversion/base.py ``TextModel.
set_gguf_parameters``: nothing reads ``sliding_window``) and llama.cpp's llama
graph has no sliding window (``build_attn_inp_kv``, swa_type NONE). So a
window the sequence never reaches agrees, and past it the references compute
different models: a ``[[finding]]`` (findings.toml).

Tiny config: ``sliding_window = None`` (a v0.2+ config): the GGUF round trip
(``--gguf``) reads back what llama.cpp computes, no window, and the default
matrix's three-way holds on both sides. HF's default 4096 is exercised by
``--set sliding_window=4096``: both agree below 4096 tokens (the test) and
differ past it (not yet a case of fixtures/matrix/long.toml: 4096+ tokens); a window the
tiny sequence does reach (``--set sliding_window=5``) is the finding at 16
tokens.
"""

from __future__ import annotations

from contract.layers import WindowSpec

from ..llama import Llama


class Mistral(Llama):
    name = "mistral"
    hf_model_type = "mistral"
    description = "llama with one sliding window on every layer (llama.cpp ignores it)"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta", "window")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        sliding_window=None,  # see the module docstring: HF's default 4096 is a --set
        tie_word_embeddings=False,
    )
    gguf_arch = "llama"

    def window(self, config, i: int):
        # MistralModel.forward: create_sliding_window_causal_mask for every layer when
        # config.sliding_window is set; MistralAttention passes it to the attention
        sw = getattr(config, "sliding_window", None)
        return WindowSpec("sliding", int(sw)) if sw else None

    def config_from_gguf(self, meta, shapes, tensors):
        # llama.cpp's llama.cpp load_arch_hparams: the RMS eps; no window key exists for
        # the arch, and its graph slides nowhere: HF's sliding_window is off
        kw = super().config_from_gguf(meta, shapes, tensors)
        kw["sliding_window"] = None
        return kw


FAMILY = Mistral()
