"""seed_oss: ByteDance Seed-OSS (HF ``SeedOssForCausalLM``,
transformers/models/seed_oss/modeling_seed_oss.py; llama.cpp
``src/models/seed-oss.cpp``; converter conversion/olmo.py ``SeedOssModel``, a
plain ``TextModel``).

HF: llama's shape with biases on q/k/v (``attention_bias``, default True) and
a separate switch for o_proj's (``attention_out_bias``, default False), a
head_dim of its own (default 128), neox RoPE, scale ``head_dim ** -0.5``.

llama.cpp: seed-oss.cpp rotates NEOX (``llama_model_rope_type``), so the
converter writes the tensors as they are (TextModel's keys only); the q/k/v
biases are optional (``create_tensor_qkv``), there is no ``attn_output.bias``
(``attention_out_bias = true`` gives a file llama.cpp refuses: HF-only). HF's
``post_attention_layernorm`` -- the norm before the MLP -- is stored as
``attn_post_norm`` (gguf's tensor map for the arch) and named so in the graph
(``cb(cur, "attn_post_norm")`` is the FFN's input norm there, not a norm on the
attention branch): ``resid_mid`` (``ffn_inp``) is what the residual holds.

Tiny config: head_dim 16 (4 heads, 2 KV heads), q/k/v biases on.
"""

from __future__ import annotations

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, text_model_gguf_params


class SeedOss(LlamaLike):
    name = "seed_oss"
    hf_model_type = "seed_oss"
    description = "QKV bias without o_proj bias, head_dim of its own"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=True, attention_out_bias=False,  # SeedOssConfig's defaults
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "seed_oss"

    def gguf_params(self, w, config, variant=None):
        # conversion/olmo.py SeedOssModel: TextModel.set_gguf_parameters only
        text_model_gguf_params(w, config)

    def config_from_gguf(self, meta, shapes, tensors):
        # seed-oss.cpp load_arch_hparams: the RMS eps; the q/k/v biases are each optional,
        # HF's one attention_bias switch asks for all three; no wo_b exists
        kw = llama_like_config(self, meta, shapes, read_hparams(meta))
        kw.pop("mlp_bias", None)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), attention_out_bias=False,
                  attention_bias=any(f"blk.0.attn_{p}.bias" in shapes for p in ("q", "k", "v", "qkv")))
        return kw


FAMILY = SeedOss()
