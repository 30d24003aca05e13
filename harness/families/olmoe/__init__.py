"""olmoe: llama's layer with a whole-row RMS QK norm before RoPE and softmax-
routed experts in every layer (HF ``OlmoeForCausalLM``,
transformers/models/olmoe/modeling_olmoe.py; llama.cpp arch ``olmoe``,
src/models/olmoe.cpp; converter conversion/olmo.py ``OlmoeModel``).

HF: ``OlmoeAttention.forward``: ``q_norm(q_proj(x))`` with ``q_norm =
OlmoeRMSNorm(hidden_size)`` and ``k_norm = OlmoeRMSNorm((hidden_size //
num_heads) * num_key_value_heads)`` over the whole projected row, then (if
``clip_qkv`` is set) the clamp, then neox RoPE; the decoder layer is llama's
(``input_layernorm``, ``post_attention_layernorm`` before the MoE);
``OlmoeSparseMoeBlock``: softmax top-k, renormalised only ``if norm_topk_prob``
(default False, as OLMoE-1B-7B).

llama.cpp (olmoe.cpp): ``build_qkv(..., reshape=false)`` -- Q/K/V as 2-D rows
(``Qcur``), ``attn_q_norm`` / ``attn_k_norm`` both ``{n_embd}`` (so the file
needs n_head_kv == n_head: MHA, as OLMoE is), the reshape, NEOX RoPE (no
permutation in the converter); no clamp anywhere in the graph (the converter
writes no ``clamp_kqv``); ``build_moe_ffn(..., LLM_FFN_SILU, false, ...)``: never
renormalised -- HF's default. The converter writes ``rms_norm_eps`` and then
overwrites it with a fixed ``1e-5`` (``OlmoeModel.set_gguf_parameters``:
``add_layer_norm_rms_eps(1e-5)`` after ``super()``): mirrored here, so a config
with another eps is a different model in llama.cpp -- measurably only where a
normed row's mean square approaches the eps: with ``--set rms_norm_eps=1e-6`` at
the tiny sizes (mean squares ~1) llamacpp vs hf passes every probe (L0 attn_in
nmse 1.8e-11, logits 3.0e-11, under float32's 1e-10), so there is no finding to
bound; the test pins the file's 1e-5 on both sides of the setting.

Tiny config: MHA (4 heads), 4 experts of 32 (2 used), eps 1e-5 (HF's default, the
converter's constant), no ``clip_qkv`` (the clamp after the QK norm is not in impl).
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, read_hparams
from ..base import LcPoint, LlamaLike, gguf_moe_convert, text_model_gguf_params

CONVERTER_EPS = 1e-5  # conversion/olmo.py OlmoeModel.set_gguf_parameters: add_layer_norm_rms_eps(1e-5)


class Olmoe(LlamaLike):
    name = "olmoe"
    fuzz_space = {"knobs": ("theta",)}
    hf_model_type = "olmoe"
    description = "whole-row QK RMS norm before RoPE, softmax-routed experts (llama.cpp: MHA, fixed eps 1e-5)"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None,
        tie_word_embeddings=False,  # olmoe.cpp: output.weight is required
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "olmoe"
    extra_settable = ()
    # OlmoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    lc_points = {
        **LlamaLike.lc_points,
        # build_qkv(..., reshape=false): the first Qcur / Kcur are 2-D (n_embd, tokens)
        "q": LcPoint("Qcur", "pre_rope", "rows"),
        "k": LcPoint("Kcur", "pre_rope", "rows"),
    }
    # OlmoeAttention: q_norm / k_norm over the whole projected row, before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="row", where="pre_rope")

    def lc_refusal(self, config) -> str | None:
        # olmoe.cpp loads attn_k_norm as {n_embd}: a GQA k_norm of (hidden // heads) * kv_heads
        # has no slot, and the converted file would not load
        if config.num_key_value_heads != config.num_attention_heads:
            return (f"num_key_value_heads {config.num_key_value_heads} != num_attention_heads "
                    f"{config.num_attention_heads}: llama.cpp's olmoe graph loads attn_k_norm as {{n_embd}} "
                    "(MHA only); run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/olmo.py OlmoeModel(TextModel).set_gguf_parameters: TextModel's keys,
        # then the eps overwritten with 1e-5 whatever the config says
        text_model_gguf_params(w, config)
        w.add_layer_norm_rms_eps(CONVERTER_EPS)

    def gguf_convert(self, name, data, config, variant=None):
        # OlmoeModel.modify_tensors stacks the per-expert tensors ("Copied from:
        # Qwen2MoeModel"); transformers 5 holds them fused (gate rows first)
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """olmoe.cpp load_arch_hparams: the RMS eps; the graph renormalises nothing
        and clamps nothing: HF's norm_topk_prob False, clip_qkv None."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, norm_topk_prob=False, clip_qkv=None)
        return kw


FAMILY = Olmoe()
