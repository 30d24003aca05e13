"""exaone_moe: K-EXAONE -- per-head QK RMS norm, RoPE on the sliding layers only
(the full layers are NoPE), sigmoid-routed experts after a dense lead (HF
``ExaoneMoeForCausalLM``, transformers/models/exaone_moe/modular_exaone_moe.py;
llama.cpp arch ``exaone-moe``, src/models/exaone-moe.cpp; converter
conversion/exaone.py ``ExaoneMoEModel(Exaone4Model)``).

HF: ``ExaoneMoeAttention`` is ``Exaone4Attention``: ``q_norm`` / ``k_norm`` over
the head before RoPE, ``if self.sliding_window is None or self._is_sliding:
apply_rotary_pos_emb`` (neox, the whole head) -- with a window, the full layers
are NoPE --, the window only on sliding layers; ``layer_types`` from
``sliding_window_pattern`` (``Exaone4Config.__post_init__``: sliding iff ``(i +
1) % pattern``). The decoder layer is ``OlmoeDecoderLayer`` (pre-norm);
``mlp_layer_types`` (``first_k_dense_replace`` dense, then
``DeepseekV3MoE``: sigmoid router with ``e_score_correction_bias``, groups,
``norm_topk_prob``, ``routed_scaling_factor``, shared experts).

llama.cpp: exaone-moe.cpp always runs iSWA (``swa_type = STANDARD``, the window
REQUIRED), ``load_swa_pattern(ml, 4)``, RoPE ``if (is_local_layer)`` (NEOX,
``n_rot == n_embd_head``), QK norms required, ``expert_gating_func``
REQUIRED; the sliding layers' base is ``rope.freq_base_swa`` (absent: the main
base). ``Qcur`` is named after the norm on a NoPE layer (the rotated / normed
tensor takes the name), the projection's own ``Qcur`` first.

The converter (``ExaoneMoEModel.set_gguf_parameters``): TextModel's keys
(``expert_gating_func`` only where config.json names ``scoring_func``), the
vocabulary, the window and the per-layer pattern from ``layer_types``
(Exaone4Model), the experts' width, shared count and width, scale, norm, the
dense lead, ``nextn_predict_layers`` and rope scaling NONE. ExaoneMoeConfig has
no ``scoring_func`` field: a checkpoint without the key converts to a file
exaone-moe.cpp refuses (the test shows it); the tiny config carries
``scoring_func = "sigmoid"`` (kept by the config as an extra key, as a
config.json's), the function HF's router always computes.

Tiny config: 4 layers (sliding, sliding, sliding, full-NoPE), window 4, layer 0
dense, 4 experts of 32 (2 used), one shared expert, scale 2.5 (the config's).
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams, swa_pattern
from ..base import LcPoint, LlamaLike, gguf_moe_convert, text_model_gguf_params
from harness.lazy import lazy

gguf = lazy("gguf")


class ExaoneMoe(LlamaLike):
    name = "exaone_moe"
    hf_model_type = "exaone_moe"
    description = "per-head QK norm, RoPE on sliding layers only (full layers NoPE), sigmoid experts"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta", "window")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        sliding_window=4, sliding_window_pattern=4, first_k_dense_replace=1,
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.5,
        scoring_func="sigmoid",  # read by the converter only (module docstring)
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    extra_settable = ("head_dim", "scoring_func")
    gguf_arch = "exaone-moe"
    # ExaoneMoeAttention: q_norm / k_norm = RMSNorm(head_dim) before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    # DeepseekV3NaiveMoe's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def uses_rope(self, config, i: int) -> bool:
        # Exaone4Attention.forward: rotate iff sliding_window is None or the layer slides
        return config.sliding_window is None or config.layer_types[i] == "sliding_attention"

    def lc_points_for(self, config, i: int):
        if self.uses_rope(config, i):
            return self.lc_points
        # exaone-moe.cpp on a full layer: no ggml_rope_ext; cb(Qcur, "Qcur") renames the normed
        # tensor, so the projection is the first Qcur (build_qkv's 2-D mm, llama-graph.cpp) and
        # what enters the attention the last
        return {**self.lc_points, "q": LcPoint("Qcur", "first", "rows"), "k": LcPoint("Kcur", "first", "rows"),
                "q_rope": LcPoint("Qcur", "last", "heads"), "k_rope": LcPoint("Kcur", "last", "heads")}

    def lc_refusal(self, config) -> str | None:
        # exaone-moe.cpp load_arch_hparams: expert_gating_func is a required key, which the
        # converter writes only from scoring_func (the window, also required, is an int in
        # ExaoneMoeConfig: HF refuses None)
        if getattr(config, "scoring_func", None) is None:
            return ("scoring_func unset: the converter writes expert_gating_func only from it and llama.cpp's "
                    "exaone-moe graph requires the key; set scoring_func=sigmoid or run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/exaone.py ExaoneMoEModel.set_gguf_parameters -> Exaone4Model's ->
        # TextModel's (the gating function only from scoring_func: conversion/base.py)

        text_model_gguf_params(w, config)
        if getattr(config, "scoring_func", None) == "sigmoid":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        elif getattr(config, "scoring_func", None) == "softmax":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        w.add_vocab_size(config.vocab_size)
        w.add_sliding_window(config.sliding_window)  # an int: ExaoneMoeConfig refuses None
        w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_count(config.num_shared_experts)
        w.add_expert_shared_feed_forward_length(config.moe_intermediate_size * config.num_shared_experts)
        w.add_expert_weights_scale(config.routed_scaling_factor)
        w.add_expert_weights_norm(config.norm_topk_prob)
        w.add_leading_dense_block_count(config.first_k_dense_replace)
        w.add_nextn_predict_layers(0)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)

    def gguf_convert(self, name, data, config, variant=None):
        # ExaoneMoEModel.modify_tensors: the experts stacked per layer (transformers 5's fused
        # gate_up_proj split, gate rows first), e_score_correction_bias renamed; no Q/K
        # permutation (NEOX); the rest as TextModel maps it
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """exaone-moe.cpp load_arch_hparams: the window (required), the pattern
        (``load_swa_pattern(ml, 4)``), the sliding base (HF has one theta: refused
        where it differs), the RMS eps, the experts' keys and the dense lead; the
        gating must be sigmoid (HF's router)."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 4)
        base_swa = meta.get_f32("rope.freq_base_swa", hp.rope_freq_base)
        if base_swa != hp.rope_freq_base:
            meta.refuse("rope.freq_base_swa", base_swa, "HF ExaoneMoe rotates with one rope_theta")
        if int(meta.get("expert_gating_func")) != 2:
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF ExaoneMoe routes by sigmoid (2)")
        kw = llama_like_config(self, meta, shapes, hp, swa=True, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        n_dense = int(meta.get("leading_dense_block_count", 0))
        n_ff_exp = one_per_layer(meta, "expert_feed_forward_length", hp.n_layer)
        n_shared = int(meta.get("expert_shared_count", 0))
        # exaone-moe.cpp: the shared experts' width is expert_shared_feed_forward_length (absent:
        # the experts'); HF's ExaoneMoeMLP(intermediate_size = moe_intermediate_size * num_shared_experts)
        n_ff_shexp = int(meta.get("expert_shared_feed_forward_length", 0)) or n_ff_exp
        if n_ff_shexp != n_ff_exp * n_shared:
            meta.refuse("expert_shared_feed_forward_length", n_ff_shexp,
                        f"HF ExaoneMoe's shared experts are expert_feed_forward_length x expert_shared_count "
                        f"= {n_ff_exp * n_shared} wide")
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, n_group=1, topk_group=1, first_k_dense_replace=n_dense,
                  moe_intermediate_size=n_ff_exp, num_shared_experts=n_shared,
                  norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                  routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                  sliding_window=int(meta.get("attention.sliding_window")), scoring_func="sigmoid",
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa])
        return kw


FAMILY = ExaoneMoe()
