"""qwen3_moe: qwen3's attention (per-head RMS QK norm before RoPE, no biases)
with a softmax-routed mixture of experts in every layer (HF
``Qwen3MoeForCausalLM``, transformers/models/qwen3_moe/modeling_qwen3_moe.py;
llama.cpp arch ``qwen3moe``, src/models/qwen3moe.cpp; converter
conversion/qwen.py ``Qwen3MoeModel(Qwen2MoeModel)``).

HF: ``Qwen3MoeAttention`` is ``Qwen3Attention`` (q_norm / k_norm over the head,
before RoPE); ``Qwen3MoeDecoderLayer`` takes ``Qwen3MoeSparseMoeBlock`` where
``(i + 1) % decoder_sparse_step == 0`` and ``i not in mlp_only_layers``;
``Qwen3MoeTopKRouter.forward``: softmax over the experts, top-k, renormalised
only ``if self.norm_topk_prob`` (``Qwen3MoeConfig`` default False; the released
Qwen3-30B-A3B / 235B-A22B config.json files set it true).

llama.cpp (qwen3moe.cpp): every layer is MoE (``ffn_gate_inp`` required, no
dense FFN slot) and ``build_moe_ffn(..., LLM_FFN_SILU, true, ...)`` -- the
top-k weights are ALWAYS renormalised; ``load_arch_hparams`` reads the experts'
width and the RMS eps. The converter (``Qwen2MoeModel.set_gguf_parameters``)
writes ``expert_feed_forward_length`` and splits transformers 5's fused
``gate_up_proj`` (gate rows first) into ``ffn_gate_exps`` / ``ffn_up_exps``.

Tiny config: every layer sparse (``decoder_sparse_step = 1``, no
``mlp_only_layers``), 4 experts of 32 (2 used) and ``norm_topk_prob = True``:
the released checkpoints' model, the one both references compute. The attention
-- all impl is handed -- is qwen3's.
"""

from __future__ import annotations

from contract.layers import WindowSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import gguf_moe_convert, text_model_gguf_params
from ..qwen3 import Qwen3


class Qwen3Moe(Qwen3):
    name = "qwen3_moe"
    fuzz_space = {"knobs": ("heads", "head_dim", "theta", "window")}
    hf_model_type = "qwen3_moe"
    description = "qwen3's per-head QK norm with softmax-routed experts in every layer"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False,
    )
    gguf_arch = "qwen3moe"
    # Qwen3MoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def window(self, config, i: int):
        """HF slides EVERY layer when a window is set: Qwen3MoeConfig.__post_init__ keeps
        sliding_window only with use_sliding_window and derives no layer_types (there is no
        max_window_layers), Qwen3MoeAttention reads config.sliding_window on every layer and
        Qwen3MoeModel.forward builds one mask, sliding wherever config.sliding_window is set
        (modeling_qwen3_moe.py). Qwen3's layer_types rule (base ``window``) saw no window
        here, and impl failed HF on every such config -- a key no case varied (issue 39)."""
        if getattr(config, "layer_types", None):  # a subclass's config that says it per layer (mellum)
            return super().window(config, i)
        sw = getattr(config, "sliding_window", None)
        return WindowSpec("sliding", int(sw)) if sw else None

    def gguf_params(self, w, config, variant=None):
        # conversion/qwen.py Qwen2MoeModel(TextModel).set_gguf_parameters: TextModel's
        # keys (the expert counts among them), then the experts' width
        text_model_gguf_params(w, config)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)

    def gguf_convert(self, name, data, config, variant=None):
        # Qwen2MoeModel.modify_tensors: the fused gate_up_proj split on dim -2 (gate
        # rows first), down_proj renamed; the rest as TextModel maps it
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """qwen3moe.cpp load_arch_hparams: the experts' width and the RMS eps; the
        graph makes every layer MoE and renormalises the top-k weights
        (build_moe_ffn norm_w = true): HF's norm_topk_prob = True, no dense layer."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer))
        return kw


FAMILY = Qwen3Moe()
