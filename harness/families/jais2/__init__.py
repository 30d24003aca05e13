"""jais2: Jais-2 -- llama's attention under LayerNorm with bias, every
projection biased, a gate-less relu2 MLP (HF ``Jais2ForCausalLM``,
transformers/models/jais2/modular_jais2.py; llama.cpp ``src/models/jais2.cpp``;
converter conversion/jais.py ``Jais2Model``).

HF: ``Jais2DecoderLayer`` is ``LlamaDecoderLayer`` with ``nn.LayerNorm(hidden,
eps=layer_norm_eps)`` (mean-centred, weight AND bias, no ``1 + w``) in both
norm slots; the attention is ``LlamaAttention`` (neox RoPE, scale ``head_dim **
-0.5``, ``attention_bias`` on q/k/v/o; ``Jais2Config`` defaults it true);
``Jais2MLP`` is ``NemotronMLP``: ``down(relu2(up(x)))`` with ``mlp_bias``.

llama.cpp: jais2.cpp ``build_norm(..., LLM_NORM)`` with ``attn_norm`` and
``attn_norm_b`` (both required), ``build_qkv`` (optional q/k/v biases), NEOX
RoPE on ``n_rot`` (``GGML_ASSERT(n_embd_head == n_rot)``), ``wo_b`` REQUIRED, the
FFN's up / down biases required; ``build_attn``'s output carries no
``attn_out`` name. So ``attention_bias = False`` or ``mlp_bias = False`` gives a
file llama.cpp refuses (missing tensor): judged against HF alone.

The converter (``Jais2Model.set_gguf_parameters``): TextModel's keys (the
LayerNorm eps from ``layer_norm_eps``; no RMS eps: Jais2Config has none), then
``rope.dimension_count = head_dim``. Nothing is permuted (neox on both sides).

Tiny config: 4 heads of 16, 2 KV heads, biases on (the config default).
"""

from __future__ import annotations

from .._gguf_import import llama_like_config, read_hparams
from ..base import LcPoint, LlamaLike, text_model_gguf_params


class Jais2(LlamaLike):
    name = "jais2"
    hf_model_type = "jais2"
    description = "LayerNorm with bias, biased projections, neox RoPE (llama's attention)"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        layer_norm_eps=1e-5, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,  # the default eos 150024 lies outside 128 tokens
        tie_word_embeddings=False,
    )
    gguf_arch = "jais2"
    input_norm_kind = "layer"  # Jais2DecoderLayer: nn.LayerNorm(hidden_size, eps=layer_norm_eps)
    weight_map = {**LlamaLike.weight_map, "input_layernorm.bias": "attn_norm_b"}
    # jais2.cpp: the rotated Q / K are named Qcur_rope / Kcur_rope (cb after ggml_rope_ext);
    # build_attn's wo output carries no name
    lc_points = {**{k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"},
                 "q_rope": LcPoint("Qcur_rope", "last", "heads"), "k_rope": LcPoint("Kcur_rope", "last", "heads")}

    def norm_eps(self, config) -> float:
        return config.layer_norm_eps

    def gguf_params(self, w, config, variant=None):
        # conversion/jais.py Jais2Model.set_gguf_parameters: TextModel's, then the rope
        # width = head_dim (hparams.get("head_dim", hidden_size // num_attention_heads))
        text_model_gguf_params(w, config)
        w.add_rope_dimension_count(self.head_dim(config))

    def lc_refusal(self, config) -> str | None:
        # jais2.cpp load_arch_tensors: wo_b and the FFN's up / down biases are created with
        # flags 0 (required): a bias-free checkpoint's file does not load
        if not (config.attention_bias and config.mlp_bias):
            return (f"attention_bias={config.attention_bias} mlp_bias={config.mlp_bias}: llama.cpp's jais2 graph "
                    "requires attn_output.bias and the FFN biases (both true); run it against --ref hf")
        return None

    def config_from_gguf(self, meta, shapes, tensors):
        # jais2.cpp load_arch_hparams: the LayerNorm eps; the graph rotates the whole head
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp)
        kw["layer_norm_eps"] = meta.get_f32("attention.layer_norm_epsilon")
        return kw


FAMILY = Jais2()
