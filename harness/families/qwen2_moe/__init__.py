"""qwen2_moe: qwen2's attention (Q/K/V biases, no o_proj bias) with softmax-
routed experts plus a sigmoid-gated shared expert (HF ``Qwen2MoeForCausalLM``,
transformers/models/qwen2_moe/modeling_qwen2_moe.py; llama.cpp arch
``qwen2moe``, src/models/qwen2moe.cpp; converter conversion/qwen.py
``Qwen2MoeModel``).

HF: ``Qwen2MoeAttention``: ``bias=config.qkv_bias`` on q/k/v, none on o; a
window only on ``layer_types[i] == "sliding_attention"`` (``Qwen2MoeConfig.
__post_init__``: only with ``use_sliding_window``, default False).
``Qwen2MoeSparseMoeBlock``: softmax top-k, renormalised only ``if
norm_topk_prob`` (default False, as Qwen1.5-MoE-A2.7B's config.json), plus
``sigmoid(shared_expert_gate(x)) * shared_expert(x)``.

llama.cpp (qwen2moe.cpp): ``build_moe_ffn(..., LLM_FFN_SILU, false, ...)`` --
the top-k weights are NEVER renormalised -- and the shared expert gated by
``ffn_gate_inp_shexp`` (required); no sliding window in the graph
(``build_attn_inp_kv``). ``load_arch_hparams`` reads the experts' and the shared
expert's widths and the RMS eps; the converter writes both widths
(``Qwen2MoeModel.set_gguf_parameters``) and splits the fused ``gate_up_proj``.

Tiny config: every layer sparse, 4 experts of 32 (2 used), a shared expert of 48,
``norm_topk_prob = False`` (HF's default: the model both compute), no window.
``--set norm_topk_prob=true`` is a finding (llama.cpp never renormalises), and
so is a window the sequence reaches (``use_sliding_window``).
"""

from __future__ import annotations

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import gguf_moe_convert, text_model_gguf_params
from ..qwen2 import Qwen2


class Qwen2Moe(Qwen2):
    name = "qwen2_moe"
    fuzz_space = {"knobs": ("heads", "theta")}
    hf_model_type = "qwen2_moe"
    description = "qwen2's QKV bias with softmax-routed experts and a gated shared expert"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
        use_sliding_window=False, tie_word_embeddings=False,
    )
    gguf_arch = "qwen2moe"
    # Qwen2MoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def gguf_params(self, w, config, variant=None):
        # conversion/qwen.py Qwen2MoeModel(TextModel).set_gguf_parameters: TextModel's
        # keys, the experts' width and the shared expert's width
        text_model_gguf_params(w, config)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)

    def gguf_convert(self, name, data, config, variant=None):
        # Qwen2MoeModel.modify_tensors: the fused gate_up_proj split (gate rows first),
        # down_proj renamed; the shared expert and its gate as gguf's tensor map names them
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """qwen2moe.cpp load_arch_hparams: the experts' and shared expert's widths and
        the RMS eps; the graph makes every layer MoE, never renormalises the top-k
        weights (norm_w = false) and has no window: HF's norm_topk_prob = False."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
                  use_sliding_window=False,
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  shared_expert_intermediate_size=int(meta.get("expert_shared_feed_forward_length", hp.ff)))
        return kw


FAMILY = Qwen2Moe()
