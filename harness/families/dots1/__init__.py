"""dots1: dots.llm1 -- qwen3's per-head QK norm before neox RoPE, MHA, and a
sigmoid-routed MoE with shared experts after ``first_k_dense_replace`` dense
layers (HF ``Dots1ForCausalLM``, transformers/models/dots1/modeling_dots1.py;
llama.cpp arch ``dots1``, src/models/dots1.cpp; converter conversion/dots1.py
``Dots1Model(Qwen2MoeModel)``).

HF:
- ``Dots1Attention``: ``q_norm`` / ``k_norm`` (RMS over ``head_dim``) before
  RoPE, scale ``head_dim ** -0.5``, biases only with ``attention_bias`` (default
  False); ``sliding_window=config.sliding_window`` on the layers
  ``Dots1Config.__post_init__`` marks ``sliding_attention``: ``i >=
  max_window_layers`` when ``sliding_window`` is set (defaults 4096 and 62 --
  dots.llm1's own 62 layers, so no layer slides);
- ``Dots1TopkRouter.forward``: ``sigmoid`` scores, the choice on ``scores +
  e_score_correction_bias``, the unbiased scores renormalised ``if
  norm_topk_prob``, times ``routed_scaling_factor``; ``Dots1MoE`` adds
  ``shared_experts`` (width ``moe_intermediate_size * n_shared_experts``).

llama.cpp (dots1.cpp): K and V loaded as ``n_embd_head_k * n_head`` wide (MHA
only: a GQA file does not load), ``attn_q_norm`` / ``attn_k_norm`` required,
NEOX RoPE (llama_model_rope_type), scale ``1/sqrt(head_dim)``, ``build_attn_inp_kv``
-- NO sliding window at all, and the converter writes none (Qwen2MoeModel's
TextModel keys read no ``sliding_window``): a window the sequence reaches is a
finding (this family's findings.toml), impl held to HF. The FFN: dense below
``leading_dense_block_count``, then ``build_moe_ffn(..., exp_probs_b, ...,
expert_weights_norm, expert_weights_scale, expert_gating_func)`` plus the shared
experts -- HF's routing, IF the file names the sigmoid gating: the converter writes
``expert_gating_func`` only from a ``scoring_func`` key in config.json
(conversion/base.py TextModel.set_gguf_parameters), which Dots1Config does not
define, and without it dots1.cpp keeps LLAMA_EXPERT_GATING_FUNC_TYPE_NONE, on
which build_moe_ffn aborts (src/llama-graph.cpp ``default: GGML_ABORT``). The
tiny config passes ``scoring_func="sigmoid"`` as an extra key (kept in
config.json, as deepseek_v3's); without it llama.cpp is refused in one line.

Tiny config: MHA (4 heads of 16), layer 0 dense and layer 1 MoE (4 experts of 32,
2 used, 1 shared), norm_topk_prob on, routed_scaling_factor 2.5, a seeded
``e_score_correction_bias``, no sliding layer (``max_window_layers`` = the depth,
as dots.llm1's config).
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import LlamaLike, gguf_moe_convert, text_model_gguf_params
from ..glm4_moe import SeededExpertBias
from harness.lazy import lazy

gguf = lazy("gguf")


class Dots1(SeededExpertBias, LlamaLike):
    name = "dots1"
    hf_model_type = "dots1"
    description = "per-head QK norm, MHA, sigmoid experts + shared after dense layers (llama.cpp: no window)"
    fuzz_space = {"knobs": ("theta",)}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        sliding_window=4096, max_window_layers=2,  # HF's window default, on no layer (as dots.llm1's 62 of 62)
        scoring_func="sigmoid",  # not a Dots1Config field: config.json's key the converter reads
        tie_word_embeddings=False,  # dots1.cpp: output.weight is required
    )
    extra_settable = ("head_dim", "scoring_func")
    gguf_arch = "dots1"
    # Dots1Experts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    # Dots1Attention: q_norm / k_norm over the head, before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")

    def lc_refusal(self, config) -> str | None:
        if config.num_key_value_heads != config.num_attention_heads:
            return (f"num_key_value_heads {config.num_key_value_heads} != num_attention_heads "
                    f"{config.num_attention_heads}: llama.cpp's dots1 graph loads K and V as n_head heads "
                    "(MHA only); run it against --ref hf")
        if getattr(config, "scoring_func", None) != "sigmoid":
            return (f"scoring_func {getattr(config, 'scoring_func', None)!r}: the converter writes "
                    "expert_gating_func only from scoring_func 'sigmoid' (HF Dots1 routes by sigmoid), "
                    "and llama.cpp's dots1 graph aborts without it; run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/dots1.py Dots1Model.set_gguf_parameters: Qwen2MoeModel's (TextModel's keys
        # with num_experts = n_routed_experts, the gating from scoring_func, the experts'
        # width), then the leading dense count, shared count, weights' scale and norm

        text_model_gguf_params(w, config)
        if getattr(config, "scoring_func", None) == "sigmoid":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_leading_dense_block_count(config.first_k_dense_replace)
        w.add_expert_shared_count(config.n_shared_experts)
        w.add_expert_weights_scale(config.routed_scaling_factor)
        w.add_expert_weights_norm(config.norm_topk_prob)

    def gguf_convert(self, name, data, config, variant=None):
        # Qwen2MoeModel.modify_tensors stacks the experts (transformers 5: fused, gate rows
        # first); shared_experts and e_score_correction_bias through ModelBase's map, unpermuted
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """dots1.cpp load_arch_hparams: the RMS eps, the leading dense layers, the
        experts' width, the shared count (required), the weights' scale and norm, the
        gating function (sigmoid: HF Dots1's only one). No window key: no layer slides
        (max_window_layers = the depth)."""
        hp = read_hparams(meta)
        gating = int(meta.get("expert_gating_func", 0) or 0)
        if gating != 2:
            meta.refuse("expert_gating_func", gating, "HF Dots1TopkRouter routes by sigmoid (2)")
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), n_routed_experts=n_exp,
                  num_experts_per_tok=n_used, n_group=1, topk_group=1, scoring_func="sigmoid",
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  n_shared_experts=int(meta.get("expert_shared_count")),
                  first_k_dense_replace=int(meta.get("leading_dense_block_count", 0)),
                  routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                  norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                  max_window_layers=hp.n_layer)
        return kw


FAMILY = Dots1()
