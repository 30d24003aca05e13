"""granitemoeshared: granitemoe plus an ungated shared expert in every layer (HF
``GraniteMoeSharedForCausalLM``,
transformers/models/granitemoeshared/modeling_granitemoeshared.py; llama.cpp
arch ``granitemoe`` -- the same file arch, granite.cpp's graph with
``n_ff_shexp > 0``; converter conversion/granite.py ``GraniteMoeModel``, which
registers both HF classes).

HF ``GraniteMoeSharedDecoderLayer.forward``: ``moe(x) + shared_mlp(x)`` of the
post-attention-normed input, then ``residual + that * residual_multiplier``;
``GraniteMoeSharedMLP``: ``input_linear`` [2S, H] chunked gate first,
``silu(gate) * up``, ``output_linear``. llama.cpp (granite.cpp
``build_layer_ffn``, MoE branch): ``build_moe_ffn(...) + build_ffn(ffn_up_shexp,
ffn_gate_shexp, ffn_down_shexp, LLM_FFN_SILU, LLM_FFN_PAR)`` of the same
``ffn_norm`` output, then the residual scale -- the same model. The converter
(``GraniteMoeModel.set_gguf_parameters``) adds
``expert_shared_feed_forward_length`` when ``shared_intermediate_size`` is truthy
and splits ``shared_mlp.input_linear`` (gate, up) into ``ffn_{gate,up}_shexp``.

The attention -- all impl is handed -- is granitemoe's.
"""

from __future__ import annotations

from ..granitemoe import GraniteMoe


class GraniteMoeShared(GraniteMoe):
    name = "granitemoeshared"
    hf_model_type = "granitemoeshared"
    description = "granitemoe with an ungated shared expert (the same llama.cpp arch)"
    tiny = dict(GraniteMoe.tiny, shared_intermediate_size=48)
    _shared_gate_first = True  # the shared expert's split (gate rows first); a test swaps it alone
    # a file of arch granitemoe is granitemoe's unless it holds a shared expert, which
    # granitemoe's reverse refuses (GraniteMoe._shared_from_gguf): then it is this family's

    def gguf_params(self, w, config, variant=None):
        # GraniteMoeModel.set_gguf_parameters: granite's keys, then the shared expert's
        # width `if shared_feed_forward_length := hparams.get("shared_intermediate_size")`
        super().gguf_params(w, config, variant)
        if config.shared_intermediate_size:
            w.add_expert_shared_feed_forward_length(config.shared_intermediate_size)

    def gguf_convert(self, name, data, config, variant=None):
        # GraniteMoeModel.modify_tensors: shared_mlp.input_linear split on dim -2 (gate, up)
        # into ffn_{gate,up}_shexp (has_experts); output_linear is gguf's ffn_down_shexp
        if name.endswith("shared_mlp.input_linear.weight"):
            gate, up = self._split_gate_up(data, self._shared_gate_first)
            base = name.removesuffix("shared_mlp.input_linear.weight") + "mlp.shared_expert."
            yield base + "gate_proj.weight", gate
            yield base + "up_proj.weight", up
        else:
            yield from super().gguf_convert(name, data, config, variant)

    def _shared_from_gguf(self, meta) -> dict:
        # granite-moe.cpp load_arch_hparams: n_ff_shexp (optional, 0: none; HF's
        # shared_intermediate_size 0 builds no shared_mlp either)
        return {"shared_intermediate_size": int(meta.get("expert_shared_feed_forward_length", 0) or 0)}


FAMILY = GraniteMoeShared()
