"""glm4: GLM-4-0414 -- interleaved partial RoPE, QKV biases and a norm on the
attention branch (HF ``Glm4ForCausalLM``, transformers/models/glm4/
modeling_glm4.py; llama.cpp ``src/models/glm4.cpp``; converter conversion/glm.py
``Glm4Model``).

HF:
- ``apply_rotary_pos_emb``: the first ``rotary_dim = head_dim *
  partial_rotary_factor`` channels rotate in INTERLEAVED pairs (``rotate_half``
  here is ``stack((-x[1::2], x[0::2]))``, cos / sin ``repeat_interleave``'d),
  the rest pass; ``Glm4Config`` defaults ``partial_rotary_factor`` to 0.5;
- ``Glm4Attention``: q/k/v biases (``attention_bias``, default True), no o_proj
  bias; scale ``head_dim ** -0.5``;
- ``Glm4DecoderLayer.forward``: ``residual + post_self_attn_layernorm(attn)``
  (impl ``post_norm``), then ``post_attention_layernorm`` before the MLP and
  ``post_mlp_layernorm`` after it.

llama.cpp: glm4.cpp rotates ``LLAMA_ROPE_TYPE_NORM`` (interleaved pairs, the
first ``n_rot``) -- HF's own order, so the converter permutes nothing (it
permutes to neox only for M-RoPE, ``Glm4Model.normal_to_neox``); it writes
TextModel's keys and ``rope.dimension_count = head_dim * partial_rotary_factor``
(``rope_parameters.get("partial_rotary_factor", 0.5)``: the same 0.5 default
as HF's). The branch norm is ``attn_post_norm`` (cb ``post_attn_norm``), the
residual after it ``ffn_inp``.

Tiny config: head_dim 16, 8 of them rotated (factor 0.5), q/k/v biases on.
"""

from __future__ import annotations

from .._gguf_import import llama_like_config, read_hparams
from ..base import LcPoint, LlamaLike, Point, text_model_gguf_params


class Glm4(LlamaLike):
    name = "glm4"
    hf_model_type = "glm4"
    description = "interleaved partial RoPE (0.5), QKV bias, norm on the attention branch"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta", "partial")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "glm4"
    rope_layout = "interleaved"  # glm4's apply_rotary_pos_emb: adjacent pairs
    post_norm_kind = "rms"  # post_self_attn_layernorm, before the residual add
    weight_map = {**LlamaLike.weight_map, "post_self_attn_layernorm.weight": "post_norm"}
    # the post_norm switch replaces impl's post_norm, which is post_self_attn_layernorm here;
    # glm4's post_attention_layernorm is the pre-MLP norm, not the attention's (switching it
    # left the branch norm's weight loaded into a layer whose post_norm was off)
    switch_modules = {**LlamaLike.switch_modules, "post_norm": ("post_self_attn_layernorm",)}
    # attn_out: what the residual adds (the normed branch); resid_mid: LlamaLike's
    # (post_attention_layernorm's input, the pre-MLP norm)
    hf_points = {**LlamaLike.hf_points, "attn_out": Point("post_self_attn_layernorm", "out")}
    lc_points = {**LlamaLike.lc_points, "attn_out": LcPoint("post_attn_norm")}

    def gguf_params(self, w, config, variant=None):
        # conversion/glm.py Glm4Model.set_gguf_parameters: TextModel's, then the rope
        # dimension count head_dim * partial_rotary_factor (default 0.5)
        text_model_gguf_params(w, config)
        prf = (config.rope_parameters or {}).get("partial_rotary_factor", 0.5)
        w.add_rope_dimension_count(int(self.head_dim(config) * prf))

    def config_from_gguf(self, meta, shapes, tensors):
        """glm4.cpp load_arch_hparams: the RMS eps and the (optional) M-RoPE sections
        (GLM-4V; refused: text rotates one position); the rotated width is
        rope.dimension_count, HF's partial_rotary_factor."""
        hp = read_hparams(meta)
        if meta.get("rope.dimension_sections", None):
            meta.refuse("rope.dimension_sections", meta.get("rope.dimension_sections"),
                        "M-RoPE (GLM-4V) permutes Q/K to neox; HF Glm4 rotates interleaved pairs")
        kw = llama_like_config(self, meta, shapes, hp, rotary=False)
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        kw["rope_parameters"]["partial_rotary_factor"] = hp.n_rot / hp.n_embd_head_k
        kw["attention_bias"] = "blk.0.attn_q.bias" in shapes or "blk.0.attn_qkv.bias" in shapes
        return kw


FAMILY = Glm4()
