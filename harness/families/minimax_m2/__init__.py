"""minimax_m2: MiniMax-M2 -- full softmax attention in every layer (no
lightning layers, unlike ``minimax``), an RMS QK norm over the WHOLE projected
row (not per head) before partial neox RoPE, and a sigmoid-routed MoE with
``e_score_correction_bias`` in every layer (HF ``MiniMaxM2ForCausalLM``,
transformers/models/minimax_m2/modeling_minimax_m2.py; llama.cpp arch
``minimax-m2``, src/models/minimax-m2.cpp; converter conversion/minimax.py
``MiniMaxM2Model``).

HF:
- ``MiniMaxM2Attention.__init__``: ``q_norm = MiniMaxM2RMSNorm(num_attention_heads
  * head_dim)``, ``k_norm = ...(num_key_value_heads * head_dim)``; ``forward``:
  ``q_norm(q_proj(x))`` / ``k_norm(k_proj(x))`` BEFORE the head view, then
  ``apply_rotary_pos_emb`` on the first ``rotary_dim = cos.shape[-1]`` channels
  of each head (``MiniMaxM2RotaryEmbedding``: ``head_dim * partial_rotary_factor``;
  ``MiniMaxM2Config.convert_rope_params_to_dict`` derives the factor from the
  released checkpoints' ``rotary_dim``);
- ``MiniMaxM2TopKRouter.forward``: ``sigmoid`` scores, top-k on ``scores +
  e_score_correction_bias``, the UNbiased scores of the chosen renormalised
  (always); ``MiniMaxM2SparseMoeBlock``: no shared expert, in every layer.

llama.cpp (minimax-m2.cpp): ``attn_q_norm`` ``{n_embd_head_k * n_head}`` and
``attn_k_norm`` ``{n_embd_k_gqa}`` -- whole-row norms applied to the 2-D
``Qcur`` / ``Kcur`` (``build_qkv(..., false)``: not reshaped) before the
reshape and ``ggml_rope_ext(n_rot)`` (NEOX: llama_model_rope_type), scale
``1/sqrt(head_dim)``; ``build_moe_ffn(..., exp_probs_b, ..., LLM_FFN_SILU,
true, expert_weights_scale, expert_gating_func)`` -- norm_w always true (HF's
renormalisation), the gating from the file: the converter writes
``expert_gating_func`` only from a ``scoring_func`` key in config.json
(conversion/base.py TextModel.set_gguf_parameters; MiniMax-M2's hub
config.json has ``"scoring_func": "sigmoid"``, MiniMaxM2Config has no such
field), and without it build_moe_ffn aborts (src/llama-graph.cpp ``default:
GGML_ABORT``). The tiny config passes it as an extra key, as dots1's.

Converter (``MiniMaxM2Model.set_gguf_parameters``): TextModel's keys, then
``expert_feed_forward_length = intermediate_size`` and ``rope.dimension_count
= rotary_dim``; the experts stacked (transformers 5 fuses them: gate rows
first), ``e_score_correction_bias`` as ``exp_probs_b``.

Tiny config: 2 layers, 4 query / 2 KV heads of 16 (so Q's and K's norm widths
differ, 64 and 32), rotary on 8 of 16 channels, 4 experts of 32 (2 used), a
seeded expert bias.
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, read_hparams
from ..base import LcPoint, LlamaLike, gguf_moe_convert, text_model_gguf_params
from ..glm4_moe import SeededExpertBias
from harness.lazy import lazy

gguf = lazy("gguf")


class MiniMaxM2(SeededExpertBias, LlamaLike):
    name = "minimax_m2"
    hf_model_type = "minimax_m2"
    description = "whole-row QK RMS norm, partial neox RoPE, sigmoid experts with a selection bias in every layer"
    fuzz_space = {"knobs": ("heads", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        num_local_experts=4, num_experts_per_tok=2,
        scoring_func="sigmoid",  # not a MiniMaxM2Config field: config.json's key the converter reads
        tie_word_embeddings=False,  # minimax-m2.cpp: output.weight is required
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    extra_settable = ("head_dim", "scoring_func")
    gguf_arch = "minimax-m2"
    # MiniMaxM2Experts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    # MiniMaxM2Attention: q_norm / k_norm over num_heads * head_dim, before the view
    qk_norm = QkNormSpec(NormSpec("rms"), over="row", where="pre_rope")
    lc_points = {
        **LlamaLike.lc_points,
        # minimax-m2.cpp build_qkv(..., false): Qcur / Kcur 2-D (n_embd, tokens) until the
        # reshape after their norms; v: the reshape_3d, cb'd after RoPE
        "q": LcPoint("Qcur", "pre_rope", "rows"),
        "k": LcPoint("Kcur", "pre_rope", "rows"),
    }

    def lc_refusal(self, config) -> str | None:
        if getattr(config, "scoring_func", None) != "sigmoid":
            return (f"scoring_func {getattr(config, 'scoring_func', None)!r}: the converter writes "
                    "expert_gating_func only from scoring_func 'sigmoid' (HF MiniMaxM2 routes by sigmoid), "
                    "and llama.cpp's minimax-m2 graph aborts without it; run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/minimax.py MiniMaxM2Model.set_gguf_parameters: TextModel's keys (the
        # gating from scoring_func), the experts' width, the rotary width (rotary_dim)

        text_model_gguf_params(w, config)
        if getattr(config, "scoring_func", None) == "sigmoid":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_feed_forward_length(config.intermediate_size)
        prf = (config.rope_parameters or {}).get("partial_rotary_factor", 1.0) or 1.0
        w.add_rope_dimension_count(int(config.head_dim * prf))

    def gguf_convert(self, name, data, config, variant=None):
        # MiniMaxM2Model.modify_tensors stacks the experts (transformers 5: fused, gate rows
        # first); e_score_correction_bias -> exp_probs_b through ModelBase's map
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """minimax-m2.cpp load_arch_hparams: the RMS eps, the experts' width, the gating
        function (sigmoid: HF MiniMaxM2TopKRouter's only one); n_rot is the rotary width
        (HF's partial_rotary_factor = n_rot / head_dim)."""
        hp = read_hparams(meta)
        gating = int(meta.get("expert_gating_func", 0) or 0)
        if gating != 2:
            meta.refuse("expert_gating_func", gating, "HF MiniMaxM2TopKRouter routes by sigmoid (2)")
        kw = llama_like_config(self, meta, shapes, hp, moe=True, rotary=False)
        n_exp, n_used = experts(meta, hp, self.name)
        kw["rope_parameters"]["partial_rotary_factor"] = hp.n_rot / hp.n_embd_head_k
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_local_experts=n_exp,
                  num_experts_per_tok=n_used, scoring_func="sigmoid",
                  intermediate_size=int(meta.get("expert_feed_forward_length")))
        return kw


FAMILY = MiniMaxM2()
