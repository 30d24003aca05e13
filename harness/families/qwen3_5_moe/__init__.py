"""qwen3_5_moe: Qwen3.5-MoE's text model (HF ``Qwen3_5MoeForCausalLM``,
model type ``qwen3_5_moe_text``, transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py;
llama.cpp arch ``qwen35moe``, src/models/qwen35moe.cpp; converter
conversion/qwen.py ``Qwen3_5MoeTextModel(_Qwen35MRopeMixin,
_LinearAttentionVReorderBase)``).

The layers are qwen3_5_text's (``harness.families.qwen3_5_text``: the gated
attention with its interleaved Q gate, ``(1 + w)`` norms, partial interleaved
MRoPE -- for text the plain partial neox rotation -- and the gated delta-net
with split projections, whose value heads the converter reorders to tiled);
the FFN is qwen3_next's MoE in every layer: ``Qwen3_5MoeTopKRouter.forward``
softmax over the experts, top-k, always renormalised; ``Qwen3_5MoeSparseMoeBlock``
adds ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``. qwen35moe.cpp:
``build_moe_ffn(..., LLM_FFN_SILU, true, ...)`` (norm_w always true) and the
shared expert times ``sigmoid(ffn_gate_inp_shexp)`` -- the same model. The
converter writes qwen3_next's expert keys (Qwen2MoeModel.set_gguf_parameters:
the experts' and the shared expert's widths) and stacks the experts.

Tiny config: qwen3_5_text's (4 layers [linear, attention, linear, attention],
2 key / 4 value delta-net heads, MRoPE sections [2, 1, 1]) with 4 experts of
32 (2 used) and a shared expert of 32.
"""

from __future__ import annotations

from ..qwen3_5_text import Qwen35Text
from .._gguf_import import read_hparams


class Qwen35Moe(Qwen35Text):
    name = "qwen3_5_moe"
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "qwen3_5_moe_text"
    description = "hybrid: qwen3_5_text's gated attention + delta-net layers, softmax experts + gated shared expert"
    tiny = {**{k: v for k, v in Qwen35Text.tiny.items() if k != "intermediate_size"},
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32}
    gguf_arch = "qwen35moe"
    # Qwen3_5MoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def gguf_params(self, w, config, variant=None):
        # Qwen3_5MoeTextModel: qwen3_5_text's keys (_Qwen35MRopeMixin) + Qwen2MoeModel's expert keys
        super().gguf_params(w, config, variant)
        self._params_experts(w, config)

    def config_from_gguf(self, meta, shapes, tensors):
        """qwen35moe.cpp load_arch_hparams: qwen35's (the hybrid keys, the MRoPE
        sections) and the experts' (``experts_config``)."""

        hp = read_hparams(meta)
        kw = self._experts_config(meta, hp, self._with_mrope(meta, self._hybrid_config(meta, shapes, hp, moe=True)))
        kw.pop("intermediate_size", None)  # Qwen3_5MoeTextConfig has no dense FFN width (the file no n_ff)
        return kw


FAMILY = Qwen35Moe()
