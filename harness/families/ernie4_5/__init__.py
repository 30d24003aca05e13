"""ernie4_5: ERNIE 4.5 dense -- interleaved RoPE computed in float32 (HF
``Ernie4_5ForCausalLM``, transformers/models/ernie4_5/modeling_ernie4_5.py;
llama.cpp ``src/models/ernie4-5.cpp``; converter conversion/ernie.py
``Ernie4_5Model``).

HF: ``apply_rotary_pos_emb`` rotates INTERLEAVED pairs over the whole head
("glm rope style (with full dim) and full precision": ``q.float()``, cos /
sin ``repeat_interleave``'d, cast back after); ``Ernie4_5Attention``: scale
``head_dim ** -0.5``, ``use_bias`` on all four projections AND the MLP (one
switch); head_dim of its own (default 128).

llama.cpp: ernie4-5.cpp rotates ``LLAMA_ROPE_TYPE_NORM`` -- the same pairs --
so the converter permutes nothing; ``Ernie4_5Model`` is TextModel's keys (and
splits a fused ``qkv_proj`` / ``up_gate_proj`` of the hub checkpoints, which
transformers 5 already holds split). q/k/v and o biases are optional, the
dense FFN has none: ``use_bias = true`` gives a file llama.cpp refuses (its
MLP biases), judged against HF alone. The ``wo`` product carries no name.

Tiny config: head_dim 16, 4 heads, 2 KV heads, tied embeddings (the config
default), no biases (ERNIE-4.5-0.3B's).
"""

from __future__ import annotations

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, text_model_gguf_params


class Ernie45(LlamaLike):
    name = "ernie4_5"
    hf_model_type = "ernie4_5"
    description = "interleaved RoPE in float32, one bias switch for attention and MLP"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        use_bias=False, tie_word_embeddings=True,
    )
    gguf_arch = "ernie4_5"
    rope_layout = "interleaved"  # ernie4_5's apply_rotary_pos_emb: adjacent pairs, the whole head
    # ernie4-5.cpp: build_attn's wo output carries no name
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"}

    def gguf_params(self, w, config, variant=None):
        # conversion/ernie.py Ernie4_5Model.set_gguf_parameters: TextModel's only
        text_model_gguf_params(w, config)

    def config_from_gguf(self, meta, shapes, tensors):
        """ernie4-5.cpp load_arch_hparams: the RMS eps and the (optional) M-RoPE
        sections (ERNIE-VL; refused); a dense file (no experts)."""
        if meta.get("rope.dimension_sections", None):
            meta.refuse("rope.dimension_sections", meta.get("rope.dimension_sections"),
                        "M-RoPE (ERNIE 4.5 VL) is not HF Ernie4_5's text RoPE")
        kw = llama_like_config(self, meta, shapes, read_hparams(meta))
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        kw["use_bias"] = "blk.0.attn_q.bias" in shapes
        return kw


FAMILY = Ernie45()
