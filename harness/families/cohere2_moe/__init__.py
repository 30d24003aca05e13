"""cohere2_moe: cohere2's layer (parallel attention + FFN block, interleaved
RoPE on the sliding layers, NoPE full layers, a logit scale) with a dense
prefix and top-k routed experts plus averaged shared experts (HF
``Cohere2MoeForCausalLM``, transformers/models/cohere2_moe/modeling_cohere2_moe.py;
llama.cpp arch ``cohere2moe``, src/models/cohere2moe.cpp; converter
conversion/command_r.py ``Cohere2MoeModel``).

HF:
- ``Cohere2MoeDecoderLayer``: ``residual + self_attn(h) + mlp(h)`` on one
  ``input_layernorm`` output -- ``Cohere2MoeRMSNorm`` if ``rms_norm_eps`` is set,
  else the bias-free ``Cohere2MoeLayerNorm`` (the config's default: None);
- ``Cohere2MoeAttention.forward``: RoPE ``if self.sliding_window is not None or
  self.force_rope``, ``force_rope = mlp_layer_types[i] == "dense" and
  prefix_dense_sliding_window_pattern == 1`` (the dense prefix is full
  attention AND rotated); interleaved pairs (``Cohere2MoeRotaryEmbedding``:
  ``repeat_interleave``);
- ``Cohere2MoeConfig.__post_init__``: ``first_k_dense_replace`` dense layers
  (their own window pattern), the rest sliding iff ``(i + 1) %
  sliding_window_pattern``;
- ``Cohere2MoeTopKRouter.forward``: top-k on the raw logits, then softmax over
  the k (``expert_selection_fn = "softmax"``, the default) or sigmoid,
  renormalised ``if norm_topk_prob``; ``Cohere2MoeSparseMoeBlock``: shared
  experts (width ``intermediate_size * num_shared_experts``) combined by
  ``"average"`` (default) or ``"sum"``;
- ``Cohere2MoeForCausalLM.forward``: ``logits * logit_scale``.

llama.cpp (cohere2moe.cpp): ``LLM_NORM_RMS`` iff the file has an RMS eps, else
``LLM_NORM`` (no bias); RoPE ``if (is_swa || force_rope)``, ``force_rope = il <
n_layer_dense_lead``; ``load_swa_pattern(ml, 4, true)``; ``build_moe_ffn(...,
expert_weights_norm, expert_weights_scale, expert_gating_func)`` -- softmax over
ALL experts, top-k, renormalised iff ``expert_weights_norm``: HF's softmax over
the top k exactly when it is renormalised (a finding otherwise); the shared
experts ``(moe + shexp) * 0.5`` -- HF's ``"average"``; ``l_out = ffn + inpL +
attn_out``; ``output`` optional (token_embd when tied); ``ggml_scale(logit_scale)``.

Converter (``Cohere2MoeModel.set_gguf_parameters``): TextModel's keys (the gating
from ``expert_selection_fn``: conversion/base.py reads it among the score-function
names), logit scale, window, the is_swa bool array, vocab size, experts' width
(``intermediate_size``), dense lead, ``expert_weights_norm = norm_topk_prob``,
the shared count and width (``"average"`` only, else ValueError), rotary width =
``head_dim``, no RoPE scaling. TextModel's ``feed_forward_length`` -- the width
cohere2moe.cpp gives the dense prefix (``n_ff``) -- is the first of
``prefix_dense_intermediate_size``, ``dense_intermediate_size``,
``intermediate_size`` the config has (conversion/base.py:1445).

The installed gguf 0.19 has no cohere2moe arch: the export writes the arch name
as a string (GGUFWriter takes any) and maps tensors with ``tensor_name_map`` over
the vendored gguf-py's ``MODEL_TENSORS[COHERE2MOE]`` list (its trunk tensors).

Tiny config: 4 layers [full+RoPE (dense, 96 wide), sliding, full NoPE, sliding],
window 4, LayerNorm, 4 heads / 2 KV heads of 16, 4 experts of 32 (2 used), 1 shared
expert, softmax routing renormalised, logit scale 0.25, tied head.
"""

from __future__ import annotations

from contract.layers import NormSpec

from .._gguf_export import tensor_name_map
from .._gguf_import import experts, hf_rope, llama_like_config, one_per_layer, read_hparams, swa_pattern
from ..base import gguf_moe_convert, text_model_gguf_params
from ..cohere2 import Cohere2
from harness.lazy import lazy

gguf = lazy("gguf")

# vendored gguf-py constants.py MODEL_TENSORS[MODEL_ARCH.COHERE2MOE], the trunk's
# (the NEXTN_* multi-token-prediction block is not compared: none in HF's model)
_TENSORS = ("TOKEN_EMBD", "OUTPUT_NORM", "OUTPUT", "ATTN_NORM", "ATTN_Q", "ATTN_K", "ATTN_V", "ATTN_OUT",
            "FFN_GATE", "FFN_DOWN", "FFN_UP", "FFN_GATE_INP", "FFN_GATE_EXP", "FFN_DOWN_EXP", "FFN_UP_EXP",
            "FFN_GATE_SHEXP", "FFN_DOWN_SHEXP", "FFN_UP_SHEXP")


class Cohere2Moe(Cohere2):
    name = "cohere2_moe"
    fuzz_space = {"knobs": ("heads", "theta", "window")}
    hf_model_type = "cohere2_moe"
    description = "cohere2's parallel block, NoPE full layers, logit scale + dense prefix, routed and shared experts"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        layer_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        sliding_window=4, sliding_window_pattern=2, first_k_dense_replace=1, prefix_dense_intermediate_size=96,
        logit_scale=0.25,
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "cohere2moe"
    experts_implementation = "eager"  # Cohere2MoeExperts.forward's loop (grouped_mm refuses float64)
    extra_settable = ("head_dim", "sliding_window_pattern", "first_k_dense_replace")  # __post_init__ kwargs

    def norm_eps(self, config) -> float:
        return config.rms_norm_eps if config.rms_norm_eps is not None else config.layer_norm_eps

    def uses_rope(self, config, i: int) -> bool:
        # Cohere2MoeAttention.forward: sliding_window is not None or force_rope
        force = config.mlp_layer_types[i] == "dense" and config.prefix_dense_sliding_window_pattern == 1
        return self._is_sliding(config, i) or force

    def layer_config(self, config, i: int):
        lc = super().layer_config(config, i)
        # Cohere2MoeDecoderLayer.input_layernorm: RMS iff rms_norm_eps is set
        return lc if config.rms_norm_eps is None else lc.replace(input_norm=NormSpec("rms", config.rms_norm_eps))

    def lc_refusal(self, config) -> str | None:
        n_dense = config.mlp_layer_types.count("dense")
        if config.mlp_layer_types != ["dense"] * n_dense + ["sparse"] * (config.num_hidden_layers - n_dense):
            return (f"mlp_layer_types {config.mlp_layer_types}: llama.cpp's cohere2moe graph has dense layers "
                    "only as a prefix (leading_dense_block_count); run it against --ref hf")
        if config.num_shared_experts and config.shared_expert_combination_strategy != "average":
            return (f"shared_expert_combination_strategy {config.shared_expert_combination_strategy!r}: the "
                    "converter accepts only 'average' (cohere2moe.cpp scales by 0.5); run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_tensor_map(self, config):
        return tensor_name_map(_TENSORS, config.num_hidden_layers)

    def gguf_params(self, w, config, variant=None):
        # conversion/command_r.py Cohere2MoeModel.set_gguf_parameters

        text_model_gguf_params(w, config)
        # conversion/base.py TextModel.set_gguf_parameters: the gating from expert_selection_fn
        w.add_expert_gating_func({"softmax": gguf.ExpertGatingFuncType.SOFTMAX,
                                  "sigmoid": gguf.ExpertGatingFuncType.SIGMOID}[config.expert_selection_fn])
        w.add_logit_scale(config.logit_scale)
        w.add_sliding_window(config.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
        w.add_vocab_size(config.vocab_size)
        w.add_expert_feed_forward_length(config.intermediate_size)
        w.add_leading_dense_block_count(config.mlp_layer_types.count("dense"))
        w.add_expert_weights_norm(bool(config.norm_topk_prob))
        if config.num_shared_experts > 0:
            w.add_expert_shared_count(config.num_shared_experts)
            w.add_expert_shared_feed_forward_length(config.intermediate_size * config.num_shared_experts)
        w.add_rope_dimension_count(self.head_dim(config))
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)

    def gguf_convert(self, name, data, config, variant=None):
        # Cohere2MoeModel.modify_tensors stacks the per-expert tensors (transformers 5 holds
        # them fused, gate rows first); the rest (zero biases dropped) as cohere2's
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """cohere2moe.cpp load_arch_hparams: a LayerNorm or an RMS eps (RMS wins), the
        window, logit scale, dense lead, experts' width, shared count / width, the
        weights' norm / scale, the gating (NONE: sigmoid), ``load_swa_pattern(ml, 4,
        true)``, ``rope.freq_base_swa``. The graph rotates the sliding layers and the
        dense prefix (``force_rope``): HF's prefix pattern 1 (full, rotated)."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 4, dense_first=True)
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa), moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        n_dense = int(meta.get("leading_dense_block_count"))
        if any(swa[:n_dense]):
            meta.refuse("attention.sliding_window_pattern", swa, "a sliding dense-prefix layer: HF rotates the "
                        "prefix only with prefix_dense_sliding_window_pattern 1 (every prefix layer full)")
        gating = int(meta.get("expert_gating_func", 0) or 2)  # cohere2moe.cpp: NONE -> SIGMOID
        if gating not in (1, 2):
            meta.refuse("expert_gating_func", gating, "HF Cohere2MoeTopKRouter routes by softmax (1) or sigmoid (2)")
        f_exp = one_per_layer(meta, "expert_feed_forward_length", hp.n_layer)
        n_shared = int(meta.get("expert_shared_count", 0))
        if n_shared and int(meta.get("expert_shared_feed_forward_length", f_exp * n_shared)) != f_exp * n_shared:
            meta.refuse("expert_shared_feed_forward_length", meta.get("expert_shared_feed_forward_length"),
                        "HF's shared experts are intermediate_size x num_shared_experts wide")
        if meta.get_f32("expert_weights_scale", 0.0) not in (0.0, 1.0):
            meta.refuse("expert_weights_scale", meta.get_f32("expert_weights_scale"), "HF has no routed scaling")
        rms = meta.get_f32("attention.layer_norm_rms_epsilon", None)
        kw.update(rope_parameters=hf_rope(meta, hp, theta=meta.get_f32("rope.freq_base_swa", hp.rope_freq_base)),
                  sliding_window=int(meta.get("attention.sliding_window")),
                  logit_scale=meta.get_f32("logit_scale"),
                  layer_norm_eps=meta.get_f32("attention.layer_norm_epsilon", 1e-5), rms_norm_eps=rms,
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa],
                  mlp_layer_types=["dense" if i < n_dense else "sparse" for i in range(hp.n_layer)],
                  prefix_dense_sliding_window_pattern=1, intermediate_size=f_exp,
                  prefix_dense_intermediate_size=hp.n_ff[0] if n_dense else None,
                  num_experts=n_exp, num_experts_per_tok=n_used, num_shared_experts=n_shared,
                  shared_expert_combination_strategy="average",
                  expert_selection_fn="softmax" if gating == 1 else "sigmoid",
                  norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                  tie_word_embeddings="output.weight" not in shapes)
        return kw


FAMILY = Cohere2Moe()
