"""ernie4_5_moe: ERNIE 4.5's attention (interleaved RoPE over the whole head,
in float32) with softmax-routed experts, a selection bias and shared experts
after leading dense layers (HF ``Ernie4_5_MoeForCausalLM``,
transformers/models/ernie4_5_moe/modular_ernie4_5_moe.py; llama.cpp arch
``ernie4_5-moe``, src/models/ernie4-5-moe.cpp with ernie4-5.cpp's
``load_arch_hparams`` / ``load_arch_tensors``; converter conversion/ernie.py
``Ernie4_5MoeModel``).

HF: ``Ernie4_5_MoeAttention`` is ernie4_5's (LlamaAttention, ``use_bias`` on
q/k/v/o); ``Ernie4_5_MoeDecoderLayer``: the sparse block where ``(i + 1) %
moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
moe_layer_end_index`` (``__post_init__``: -1 is the last layer), else a dense
MLP; ``Ernie4_5_MoeTopKRouter.forward`` (float32): softmax, top-k of the
softmax PLUS ``moe_statics.e_score_correction_bias`` (selection only), the
unbiased weights gathered and divided by ``clamp(sum, moe_norm_min)``;
``Ernie4_5_MoeSparseMoeBlock``: plus the shared experts (one MLP of
``moe_intermediate_size * moe_num_shared_experts``), ungated.

llama.cpp (ernie4-5-moe.cpp): MoE where ``il >= n_layer_dense_lead && (il + 1)
% n_moe_layer_step == 0``; ``build_moe_ffn(..., ffn_exp_probs_b, ...,
LLM_FFN_SILU, true, ..., SOFTMAX)`` -- the bias added for the selection only,
the weights renormalised -- plus the ungated shared expert; ``attn_out`` is
named after ``build_attn`` (the dense ernie4-5.cpp names none). ernie4-5.cpp
``load_arch_tensors`` loads MoE tensors on EVERY layer past the dense lead, so
a ``moe_layer_interval`` above 1 gives a file llama.cpp refuses (its dense
layers have no ``ffn_gate_inp``); ``moe_layer_end_index`` has no key.

Converter (``Ernie4_5MoeModel.set_gguf_parameters``): TextModel's keys, expert
count / used, ``interleave_moe_layer_step``, ``leading_dense_block_count`` =
``moe_layer_start_index``, the experts' width, the shared count and the shared
width as ``intermediate_size // num_key_value_heads`` -- not HF's
``moe_intermediate_size * moe_num_shared_experts``; the two agree on
ERNIE-4.5-21B-A3B (12288 // 4 = 1536 * 2) and on the tiny config here
(96 // 2 = 24 * 2); elsewhere the file's shared-expert tensors do not have
the width it says and llama.cpp refuses it.

Tiny config: 2 layers, layer 0 dense (``moe_layer_start_index = 1``, as the
released checkpoints), 4 experts of 24 (2 used), 2 shared, tied embeddings.
"""

from __future__ import annotations

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import LlamaLike, gguf_moe_convert
from ..ernie4_5 import Ernie45


class Ernie45Moe(Ernie45):
    name = "ernie4_5_moe"
    hf_model_type = "ernie4_5_moe"
    description = "ernie4_5's interleaved RoPE with biased-selection experts, shared experts and a dense lead"
    # not "heads": the converter's shared width is intermediate_size // num_key_value_heads
    fuzz_space = {"knobs": ("theta",)}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        use_bias=False, tie_word_embeddings=True,
        moe_intermediate_size=24, moe_k=2, moe_num_experts=4, moe_num_shared_experts=2,
        moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=1,
    )
    gguf_arch = "ernie4_5-moe"
    # MixtralExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    # ernie4-5-moe.cpp: cb(cur, "attn_out", il) after build_attn
    lc_points = LlamaLike.lc_points
    _write_selection_bias = True  # what the converter does; a test switches it off

    def init_value(self, name, p, r):
        if name.endswith("e_score_correction_bias"):
            # HF's init is zeros (Ernie4_5_MoePreTrainedModel._init_weights): a seeded bias of
            # the softmax's own size so the biased selection differs from the plain top-k
            return 0.1 * r
        return super().init_value(name, p, r)

    def lc_refusal(self, config) -> str | None:
        shared = config.moe_intermediate_size * config.moe_num_shared_experts
        if shared and config.intermediate_size // config.num_key_value_heads != shared:
            return (f"intermediate_size // num_key_value_heads = {config.intermediate_size // config.num_key_value_heads}"
                    f" is the shared experts' width the converter writes (conversion/ernie.py), HF's is "
                    f"moe_intermediate_size * moe_num_shared_experts = {shared}: llama.cpp refuses the file; "
                    "run it against --ref hf")
        if config.moe_layer_interval != 1 or config.moe_layer_end_index != config.num_hidden_layers - 1:
            return ("moe_layer_interval 1 and moe_layer_end_index -1 only: ernie4-5.cpp load_arch_tensors "
                    "loads MoE tensors on every layer past the dense lead; run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/ernie.py Ernie4_5MoeModel.set_gguf_parameters: Ernie4_5Model's (TextModel's)
        # keys, then the MoE layout; the shared width from intermediate_size // num_key_value_heads
        super().gguf_params(w, config, variant)
        w.add_interleave_moe_layer_step(config.moe_layer_interval)
        w.add_leading_dense_block_count(config.moe_layer_start_index)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_count(config.moe_num_shared_experts)
        if config.moe_num_shared_experts > 0:
            w.add_expert_shared_feed_forward_length(config.intermediate_size // config.num_key_value_heads)

    def gguf_convert(self, name, data, config, variant=None):
        # transformers 5 keeps the selection bias under the router (conversion_mapping.py
        # ernie4_5_moe: "mlp.moe_statics.e_score_correction_bias" ->
        # "mlp.gate.moe_statics..."; save_pretrained writes it back), which
        # ModelBase.filter_tensors renames to e_score_correction.bias -> blk.N.exp_probs_b
        if name.endswith("mlp.gate.moe_statics.e_score_correction_bias"):
            if not self._write_selection_bias:
                return
            yield name.replace("mlp.gate.moe_statics.e_score_correction_bias",
                               "mlp.moe_statics.e_score_correction.bias"), data
            return
        # Ernie4_5MoeModel.modify_tensors stacks the per-expert tensors; transformers 5 holds
        # them fused (gate rows first)
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """ernie4-5.cpp load_arch_hparams (ERNIE4_5_MOE): the experts' width, the shared
        width (optional), the MoE step and the dense lead; the graph renormalises the
        top-k weights (HF always does) and every layer past the lead is MoE."""
        if meta.get("rope.dimension_sections", None):
            meta.refuse("rope.dimension_sections", meta.get("rope.dimension_sections"),
                        "M-RoPE (ERNIE 4.5 VL) is not HF Ernie4_5_Moe's text RoPE")
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        step = int(meta.get("interleave_moe_layer_step"))
        if step != 1:
            meta.refuse("interleave_moe_layer_step", step, "ernie4-5.cpp loads MoE tensors on every layer past "
                        "the dense lead; only step 1 loads")
        ff_exp = one_per_layer(meta, "expert_feed_forward_length", hp.n_layer)
        # llama.cpp reads no shared count: a shared expert is there iff its width is
        # (n_ff_shexp > 0), and HF's is moe_intermediate_size * moe_num_shared_experts
        shexp = int(meta.get("expert_shared_feed_forward_length", 0))
        if shexp % ff_exp:
            meta.refuse("expert_shared_feed_forward_length", shexp,
                        f"HF's shared experts are a multiple of moe_intermediate_size {ff_exp} wide")
        n_shared = shexp // ff_exp
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), moe_num_experts=n_exp,
                  moe_k=n_used, moe_intermediate_size=ff_exp, moe_num_shared_experts=n_shared,
                  moe_layer_start_index=int(meta.get("leading_dense_block_count", 0)), moe_layer_interval=step,
                  moe_layer_end_index=-1, use_bias="blk.0.attn_q.bias" in shapes)
        return kw


FAMILY = Ernie45Moe()
