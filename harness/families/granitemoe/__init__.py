"""granitemoe: granite's attention (the multiplier as the softmax scale, the
residual and embedding multipliers, neox RoPE permuted by the converter) with a
top-k-then-softmax mixture of experts in every layer (HF
``GraniteMoeForCausalLM``, transformers/models/granitemoe/modeling_granitemoe.py;
llama.cpp arch ``granitemoe``, src/models/granite-moe.cpp, which runs
granite.cpp's graph: ``using graph = llama_model_granite::graph`` in
src/models/models.h; converter conversion/granite.py ``GraniteMoeModel(GraniteModel)``).

HF: ``GraniteMoeAttention`` is granite's (``self.scaling =
config.attention_multiplier``); ``GraniteMoeDecoderLayer.forward`` adds both
branches times ``residual_multiplier``; ``GraniteMoeTopKRouter.forward``: top-k
of the router LOGITS, then a softmax over those k -- the same weights as
llama.cpp's ``build_moe_ffn(..., LLM_FFN_SILU, true, ..., SOFTMAX)`` (softmax
over all experts, top-k, renormalised: ``e^l_i / sum_topk e^l_j`` either way).
Experts of width ``intermediate_size`` (``GraniteMoeExperts``: ``gate_up_proj``
[E, 2F, H], gate rows first).

llama.cpp: ``granite_moe::load_arch_hparams`` reads granite's four scales and
the optional shared-expert width, NOT ``rope.scaling.finetuned`` or
``deepstack_mapping`` (those are granite.cpp's loader only), so every layer
rotates (rope_pattern's default 1, src/llama-model.cpp load_hparams). The
converter splits the fused ``block_sparse_moe.input_linear`` (transformers 5:
``block_sparse_moe.experts.gate_up_proj``) on dim -2 into gate then up.

Tiny config: granite's multipliers and biases, 4 experts of 32 (2 used).
"""

from __future__ import annotations

from .._gguf_import import experts, llama_like_config, read_hparams
from ..granite import Granite


class GraniteMoe(Granite):
    name = "granitemoe"
    hf_model_type = "granitemoe"
    description = "granite's multipliers with top-k-softmax experts in every layer"
    tiny = dict(
        Granite.tiny, intermediate_size=32,  # the experts' width (GraniteMoeExperts)
        num_local_experts=4, num_experts_per_tok=2,
    )
    gguf_arch = "granitemoe"
    # GraniteMoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    # the converter's split of the fused gate/up (gate rows first); a test swaps it to show
    # the references' comparison of the FFN notices (instance state: part of the export's key)
    _gate_first = True

    @staticmethod
    def _split_gate_up(data, gate_first: bool = True):
        f = data.shape[-2] // 2
        gate, up = data[..., :f, :], data[..., f:, :]
        return (gate, up) if gate_first else (up, gate)

    def gguf_convert(self, name, data, config, variant=None):
        # conversion/granite.py GraniteMoeModel.modify_tensors: input_linear (transformers 5's
        # experts.gate_up_proj, [E, 2F, H]) split on dim -2, gate first; output_linear
        # (experts.down_proj) and router.layer (router.weight) as gguf's tensor map names them
        if name.endswith("block_sparse_moe.experts.gate_up_proj"):
            gate, up = self._split_gate_up(data, self._gate_first)
            base = name.removesuffix("block_sparse_moe.experts.gate_up_proj") + "mlp.experts."
            yield base + "gate_proj.weight", gate
            yield base + "up_proj.weight", up
        elif name.endswith("block_sparse_moe.experts.down_proj"):
            yield name.removesuffix("block_sparse_moe.experts.down_proj") + "mlp.experts.down_proj.weight", data
        elif name.endswith("block_sparse_moe.router.weight"):
            yield name.replace("router.weight", "router.layer.weight"), data
        else:
            yield from super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """granite-moe.cpp load_arch_hparams: the RMS eps and logit scale (required),
        the residual / embedding / attention scales (optional: 0 means none), the
        shared expert's width (optional; granitemoeshared's); the expert counts from
        the generic keys, their width is n_ff. The graph's routing is HF's."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        hd = kw["hidden_size"] // kw["num_attention_heads"]
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  logits_scaling=meta.get_f32("logit_scale"),
                  residual_multiplier=meta.get_f32("residual_scale", 0.0) or 1.0,
                  embedding_multiplier=meta.get_f32("embedding_scale", 0.0) or 1.0,
                  attention_multiplier=meta.get_f32("attention.scale", 0.0) or float(hd) ** -0.5,
                  num_local_experts=n_exp, num_experts_per_tok=n_used)
        kw.update(self._shared_from_gguf(meta))
        return kw

    def _shared_from_gguf(self, meta) -> dict:
        # granitemoe's HF config has no shared expert: a file with one is granitemoeshared's
        n = int(meta.get("expert_shared_feed_forward_length", 0) or 0)
        if n:
            meta.refuse("expert_shared_feed_forward_length", n,
                        "a shared expert; read it as --family granitemoeshared")
        return {}


FAMILY = GraniteMoe()
