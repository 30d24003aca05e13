"""mellum: qwen3_moe's attention (per-head RMS QK norm before RoPE, no biases)
with sliding-window layers by ``layer_types``, RoPE parameters per layer type and
softmax-routed experts (HF ``MellumForCausalLM``,
transformers/models/mellum/modeling_mellum.py -- ``MellumAttention`` is
``Qwen3MoeAttention`` with ``sliding_window`` on the sliding layers,
``MellumDecoderLayer`` is Laguna's: ``MellumSparseMoeBlock`` where
``mlp_layer_types[i] == "sparse"``, a dense ``MellumMLP`` otherwise; llama.cpp arch
``mellum``, src/models/mellum.cpp; converter conversion/mellum.py
``MellumModel``).

HF ``MellumRotaryEmbedding``: one inv_freq per layer type, from
``rope_parameters[layer_type]`` (``MellumConfig`` default: full 5e5, sliding 1e4).
``MellumTopKRouter``: softmax, top-k, renormalised ``if norm_topk_prob``
(default True).

llama.cpp (mellum.cpp): RMS ``attn_norm``, ``build_qkv``, ``attn_q_norm`` /
``attn_k_norm`` per head (``{n_embd_head_k}``), NEOX RoPE, ``build_attn`` on the
iswa KV cache where ``attention.sliding_window`` > 0 (``load_swa_pattern(ml, 4)``:
the converter's per-layer pattern), every layer MoE (``ffn_gate_inp`` required:
a dense ``mlp_layer_types`` entry is refused for llama.cpp) with
``build_moe_ffn(..., LLM_FFN_SILU, true, ...)``: always renormalised. The sliding
layers' ``ggml_rope_ext`` takes ``freq_base`` -- the full layers' base --
although ``load_arch_hparams`` reads ``rope.freq_base_swa``: where the two
thetas differ (HF's default config) llama.cpp rotates the sliding layers with
the full base (a finding, findings.toml; the same as olmo3's olmo2.cpp).

The converter (``MellumModel.set_gguf_parameters``): TextModel's keys (both
thetas: ``rope.freq_base`` from ``full_attention``, ``rope.freq_base_swa`` from
``sliding_attention``), ``expert_feed_forward_length``, the window and its
pattern from ``layer_types``; ``modify_tensors`` stacks the per-expert tensors
(transformers 5 holds them fused, gate rows first). The installed gguf 0.19 has no
``mellum`` arch: its tensors are named with qwen3moe's map (the same MODEL_TENSORS
list in llama.cpp's gguf-py constants.py, less qwen3moe's ``rope_freqs``).

Tiny config: 2 layers (sliding, full), window 4, 4 heads / 2 KV heads of 16,
4 experts of 32 (2 used), ``norm_topk_prob`` True, both thetas 1e4 (the theta
finding is exercised with ``--set``).
"""

from __future__ import annotations

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams, swa_pattern
from ..base import text_model_gguf_params
from ..qwen3_moe import Qwen3Moe


class Mellum(Qwen3Moe):
    name = "mellum"
    fuzz_space = {"knobs": ("heads", "head_dim", "window")}
    hf_model_type = "mellum"
    description = "qwen3_moe's QK norm and experts with sliding layers and RoPE per layer type"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        mlp_layer_types=["sparse", "sparse"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        tie_word_embeddings=False,  # mellum.cpp: output.weight is required
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "mellum"
    gguf_tensor_names_from = "qwen3moe"  # gguf 0.19 has no mellum (module docstring)
    # MellumRotaryEmbedding: position_embeddings[layer_type]
    rope_per_layer_type = True
    # window: LlamaLike's (layer_types[i] == "sliding_attention" -> config.sliding_window)

    def lc_refusal(self, config) -> str | None:
        dense = [i for i, t in enumerate(config.mlp_layer_types) if t != "sparse"]
        if dense:
            return (f"mlp_layer_types has dense layers {dense}: llama.cpp's mellum graph makes every layer MoE "
                    "(mellum.cpp load_arch_tensors: ffn_gate_inp required); run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/mellum.py MellumModel.set_gguf_parameters: TextModel's keys, the experts'
        # width, then (use_sliding_window is no MellumConfig field: None) the window and the
        # pattern from layer_types
        text_model_gguf_params(w, config)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        if config.sliding_window is not None:
            w.add_sliding_window(config.sliding_window)
            w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    def config_from_gguf(self, meta, shapes, tensors):
        """mellum.cpp load_arch_hparams: the RMS eps, the experts' width, the window and
        its pattern (``load_swa_pattern(ml, 4)``) and ``rope.freq_base_swa``, which the
        graph does not use (the sliding layers rotate with ``rope.freq_base``): the HF
        config gets that base on both layer types. Every layer MoE, renormalised."""
        hp = read_hparams(meta)
        n_swa = int(meta.get("attention.sliding_window", 0))
        if n_swa > 0:
            swa = swa_pattern(meta, hp, 4)
            meta.skip("rope.freq_base_swa", "mellum.cpp reads it, but its graph rotates the sliding layers with "
                                            "rope.freq_base")
        else:
            swa = [False] * hp.n_layer
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                meta.skip(key, "mellum.cpp reads it only when attention.sliding_window > 0")
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa), moe=True)
        full = kw["rope_parameters"]
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, norm_topk_prob=True, mlp_layer_types=["sparse"] * hp.n_layer,
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  sliding_window=n_swa or None,
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa],
                  rope_parameters={"full_attention": full,
                                   "sliding_attention": {"rope_type": "default", "rope_theta": full["rope_theta"]}})
        return kw


FAMILY = Mellum()
