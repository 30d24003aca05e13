"""granitemoe_swa: granite_swa's attention (granite's multipliers, interleaved
sliding window, per-head sinks) with granitemoeshared's FFN -- top-k-softmax
experts plus an optional ungated shared expert (HF ``GraniteMoeSWAForCausalLM``,
transformers/models/granitemoe_swa/modular_granitemoe_swa.py; llama.cpp arch
``granite_swa``, the same graph as the dense form: src/models/granite-swa.cpp
``build_layer_ffn``'s MoE branch when ``ffn_gate_inp`` is loaded; converter
conversion/granite.py ``GraniteMoeSWAModel(GraniteSWAModel)``).

The attention is granite_swa's, probe for probe (see its docstring: HF's eager
path spells the sink as an output scale, so HF's ``attn_probs`` is not
granite_swa's and is not compared with HF; ``attn_heads`` on are). The FFN:
``GraniteMoeSWATopKRouter`` (granitemoe's: top-k of the logits, then a softmax
over those k) = ``build_moe_ffn(..., LLM_FFN_SILU, true, ..., SOFTMAX)``; the
experts' ``gate_up_proj`` [E, 2F, H] is kept FUSED by this converter
(``ffn_gate_up_exps``; build_moe_ffn's merged path views the first F rows as the
gate, as HF's ``chunk(2)`` does); the shared expert's ``input_linear`` [2S, H]
fused too (``ffn_up_shexp``, ``LLM_FFN_SWIGLU``: silu of the first half times the
second, HF ``GraniteMoeSWAMLP``), written with ``expert_shared_feed_forward_length``.

Tiny config: granite_swa's, 4 experts of 32 (2 used) and a shared expert of 48.
"""

from __future__ import annotations

import numpy as np

from .._gguf_import import experts
from ..granitemoe import GraniteMoe
from ..granite_swa import GraniteSWA


class GraniteMoeSWA(GraniteSWA):
    name = "granitemoe_swa"
    hf_model_type = "granitemoe_swa"
    description = "granite_swa's sinks and windows with top-k-softmax experts and a shared expert"
    tiny = dict(GraniteSWA.tiny, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                shared_intermediate_size=48)
    _tensor_map_arch = "granitemoe"  # ffn_gate_inp, ffn_down_exps, ffn_{up,down}_shexp
    # GraniteMoeSWAExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    _moe = True
    # the fused gate_up's halves, gate first (build_moe_ffn's merged path views the first F
    # rows as the gate); a test swaps them to show the references' comparison of the FFN
    # notices (instance state: part of the export's key)
    _gate_first = True

    def gguf_params(self, w, config, variant=None):
        # GraniteMoeSWAModel.set_gguf_parameters: granite_swa's keys, then the shared width
        # `if shared_intermediate_size := hparams.get(...)` (only when truthy)
        super().gguf_params(w, config, variant)
        if config.shared_intermediate_size:
            w.add_expert_shared_feed_forward_length(config.shared_intermediate_size)

    def gguf_convert(self, name, data, config, variant=None):
        # GraniteMoeSWAModel.modify_tensors: the experts' gate_up_proj kept fused
        # (FFN_GATE_UP_EXP), down_proj as FFN_DOWN_EXP, the shared input_linear fused as
        # FFN_UP_SHEXP, output_linear as FFN_DOWN_SHEXP; the rest (router, sinks) granite_swa's
        if name.endswith("block_sparse_moe.experts.gate_up_proj"):
            gate, up = GraniteMoe._split_gate_up(data, self._gate_first)
            yield name + ".weight", np.concatenate([gate, up], axis=-2)  # _WithSinks: ffn_gate_up_exps
        elif name.endswith("block_sparse_moe.experts.down_proj"):
            yield name.removesuffix("block_sparse_moe.experts.down_proj") + "mlp.experts.down_proj.weight", data
        elif name.endswith("block_sparse_moe.router.weight"):
            yield name.replace("router.weight", "router.layer.weight"), data
        elif name.endswith("shared_mlp.input_linear.weight"):
            yield name.removesuffix("shared_mlp.input_linear.weight") + "mlp.shared_expert.up_proj.weight", data
        else:
            yield from super().gguf_convert(name, data, config, variant)

    def _experts_from_gguf(self, meta, hp) -> dict:
        # granite-swa.cpp load_arch_hparams: expert_count / expert_used_count (optional there;
        # HF's model has experts, so required here), the shared width (optional, 0: none)
        n_exp, n_used = experts(meta, hp, self.name)
        return {"num_local_experts": n_exp, "num_experts_per_tok": n_used,
                "shared_intermediate_size": int(meta.get("expert_shared_feed_forward_length", 0) or 0)}


FAMILY = GraniteMoeSWA()
