"""glm: GLM-4 (the ``-hf`` checkpoints; HF ``GlmForCausalLM``,
transformers/models/glm/modeling_glm.py; llama.cpp arch ``chatglm``,
src/models/chatglm.cpp; converter conversion/chatglm.py ``ChatGLMModel``).

HF:
- ``apply_rotary_pos_emb``: the first ``head_dim * partial_rotary_factor``
  channels rotate in INTERLEAVED pairs (``rotate_half``: ``stack((-x[1::2],
  x[0::2]))``, cos / sin ``repeat_interleave``'d), the rest pass;
  ``GlmConfig.__post_init__`` defaults the factor to 0.5;
- ``GlmAttention``: q/k/v biases (``attention_bias``, default True), o_proj
  bias-free, scale ``head_dim ** -0.5``; a plain pre-norm decoder layer;
  ``GlmMLP``: the fused ``gate_up_proj`` (gate rows first).

llama.cpp: chatglm.cpp rotates ``LLAMA_ROPE_TYPE_NORM`` (interleaved, the first
``n_rot``): HF's order, nothing permuted; ``wo`` is ``{n_embd, n_embd}`` (a
head width other than hidden / heads does not load); ``ffn_up`` is the fused
``{n_embd, 2 n_ff}`` under SWIGLU (gate half first, as HF's chunk);
``build_attn``'s output carries no name.

THE TRAPS (``ChatGLMModel.set_gguf_parameters``, conversion/chatglm.py:134-157,
written for THUDM's original ChatGLM config.json, which GlmConfig's names do
not match):
- the RMS eps is ``hparams.get("layernorm_epsilon", 1e-5)`` -- GlmConfig names
  it ``rms_norm_eps`` (default 1.5625e-07), so every file says 1e-5;
- the RoPE base is ``10000 * rope_ratio`` -- GlmConfig has no ``rope_ratio``
  and keeps its base in ``rope_parameters.rope_theta``: every file says 10000;
- the rotated width is ``hidden_size // num_attention_heads *
  partial_rotary_factor`` (``attention_dim`` absent), not ``head_dim``'s;
- the context length is ``seq_length`` or, absent, ``hidden_size``.
The export mirrors all four; findings.toml bounds where HF's model differs,
the tests show both sides. The tiny config sits where both agree (eps 1e-5,
theta 10000, head_dim = hidden / heads).

Tiny config: 4 heads of 16 (= 64 / 4), 2 KV heads, 8 channels rotated, q/k/v
biases on.
"""

from __future__ import annotations

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike

# conversion/chatglm.py ChatGLMModel.set_gguf_parameters: the values it writes where
# THUDM's keys (layernorm_epsilon, rope_ratio) are absent, as in every GlmConfig
CONVERTER_EPS = 1e-5
CONVERTER_THETA = 10000.0


class Glm(LlamaLike):
    name = "glm"
    hf_model_type = "glm"
    description = "interleaved partial RoPE (0.5), QKV bias; the chatglm converter's fixed eps / theta"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone);
    # no "heads" (the head width is GlmConfig's own head_dim, and chatglm.cpp needs head_dim x
    # heads = hidden) and no "theta" (the converter writes 10000 whatever it is: findings.toml)
    fuzz_space = {"knobs": ("partial",)}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=CONVERTER_EPS, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": CONVERTER_THETA, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "chatglm"
    rope_layout = "interleaved"  # glm's apply_rotary_pos_emb: adjacent pairs
    # chatglm.cpp: build_attn's wo output carries no name
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"}

    def lc_refusal(self, config) -> str | None:
        # chatglm.cpp load_arch_tensors: wo is {n_embd, n_embd}
        if self.head_dim(config) * config.num_attention_heads != config.hidden_size:
            return (f"head_dim={self.head_dim(config)} x {config.num_attention_heads} heads != hidden_size="
                    f"{config.hidden_size}: llama.cpp's chatglm graph loads attn_output as {{n_embd, n_embd}}; "
                    "use head_dim = hidden / heads or run it against --ref hf")
        return super().lc_refusal(config)

    def gguf_params(self, w, config, variant=None):
        # conversion/chatglm.py:134-157 ChatGLMModel.set_gguf_parameters, key for key (NOT
        # TextModel's): THUDM's key names, read from GlmConfig's dict where none is present
        w.add_context_length(getattr(config, "seq_length", None) or config.hidden_size)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(getattr(config, "multi_query_group_num", None) or config.num_key_value_heads)
        w.add_layer_norm_rms_eps(getattr(config, "layernorm_epsilon", None) or CONVERTER_EPS)
        rope_dim = getattr(config, "attention_dim", None) or config.hidden_size // config.num_attention_heads
        w.add_rope_dimension_count(int(rope_dim * (config.rope_parameters or {}).get("partial_rotary_factor", 0.5)))
        w.add_rope_freq_base(CONVERTER_THETA * (getattr(config, "rope_ratio", None) or 1))

    def config_from_gguf(self, meta, shapes, tensors):
        """chatglm.cpp load_arch_hparams: the RMS eps; the rotated width is
        rope.dimension_count (HF's partial_rotary_factor), the base rope.freq_base;
        the head is hidden / heads (wo {n_embd, n_embd})."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, rotary=False)
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        kw["rope_parameters"]["partial_rotary_factor"] = hp.n_rot / hp.n_embd_head_k
        kw["attention_bias"] = "blk.0.attn_q.bias" in shapes or "blk.0.attn_qkv.bias" in shapes
        return kw


FAMILY = Glm()
