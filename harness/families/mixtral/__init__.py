"""mixtral: mistral's attention (llama's, optionally windowed) with a softmax-
routed mixture of experts in every layer (HF ``MixtralForCausalLM``,
transformers/models/mixtral/modeling_mixtral.py; llama.cpp arch ``llama``,
src/models/llama.cpp with ``n_expert > 0``; converter conversion/llama.py:
``MixtralForCausalLM`` is registered with ``LlamaModel``).

HF: ``MixtralAttention`` is mistral's (``sliding_window=config.sliding_window``,
``MixtralConfig`` default None); ``MixtralTopKRouter.forward``: softmax, top-k,
ALWAYS renormalised; experts of width ``intermediate_size``.

llama.cpp (llama.cpp): with ``n_expert > 0`` each layer loads ``ffn_gate_inp``
and ``ffn_{gate,up,down}_exps`` of width ``n_ff`` (``feed_forward_length``, which
the converter writes from ``intermediate_size``) and calls
``build_moe_ffn(..., LLM_FFN_SILU, true, ..., SOFTMAX)`` -- the same routing.
``LlamaModel`` permutes Q/K rows (mistral's, harness.families.mistral), and
the llama graph has no window: a window the sequence reaches is mistral's
finding (this family's findings.toml, the same disagreement).

Tiny config: 4 experts (2 used) of width 96, no window (Mixtral-8x7B-v0.1's
config.json has ``sliding_window: null``).
"""

from __future__ import annotations

from .._gguf_import import experts, llama_like_config, read_hparams
from ..base import gguf_moe_convert
from ..mistral import Mistral


class Mixtral(Mistral):
    name = "mixtral"
    hf_model_type = "mixtral"
    description = "mistral with softmax-routed experts in every layer (llama.cpp's llama graph with n_expert)"
    fuzz_space = {"knobs": ("heads", "head_dim", "theta", "window")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
        sliding_window=None, tie_word_embeddings=False,
    )
    # MixtralExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def gguf_params(self, w, config, variant=None):
        # conversion/base.py TextModel.set_gguf_parameters writes expert_count /
        # expert_used_count (num_local_experts, num_experts_per_tok) before LlamaModel's keys
        super().gguf_params(w, config, variant)
        w.add_expert_count(config.num_local_experts)
        w.add_expert_used_count(config.num_experts_per_tok)

    def gguf_convert(self, name, data, config, variant=None):
        # LlamaModel.modify_tensors stacks the per-expert w1 / w3 / w2 into
        # ffn_{gate,up,down}_exps; transformers 5 holds them fused (gate rows first)
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """llama.cpp's llama load_arch_hparams: the RMS eps; the expert counts from the
        generic keys, the experts' width is n_ff; no window (mistral's)."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_local_experts=n_exp,
                  num_experts_per_tok=n_used, router_jitter_noise=0.0, sliding_window=None)
        return kw


FAMILY = Mixtral()
