"""nemotron: Nemotron / Minitron -- LayerNorm1P with bias, partial neox RoPE
(HF ``NemotronForCausalLM``, transformers/models/nemotron/modeling_nemotron.py;
llama.cpp ``src/models/nemotron.cpp``; converter conversion/nemotron.py
``NemotronModel``).

HF:
- ``NemotronLayerNorm1P``: ``F.layer_norm(x, weight + 1, bias, eps)`` -- a
  LayerNorm (mean-centred) whose weight is stored around 0, with a bias;
- ``NemotronAttention``: neox RoPE on the first ``head_dim *
  partial_rotary_factor`` channels (``NemotronConfig`` defaults the factor to
  0.5), scale ``head_dim ** -0.5``, ``attention_bias`` on all four;
- ``NemotronMLP``: ``down(relu2(up(x)))`` (the FFN half).

llama.cpp: nemotron.cpp ``build_norm(..., LLM_NORM)`` with weight and bias
(the converter stores ``weight + 1``: "layernorm1p w/o changing anything on
the GGML engine side"), NEOX RoPE on ``n_rot`` channels (no permutation), the
optional biases of ``create_tensor_qkv`` and ``wo_b``.

impl gets the LayerNorm's effective weight ``1 + w`` (``layer_weights``), the
function llama.cpp computes from the stored ``w + 1``: impl's ``layer`` norm.

The converter writes ``rope.dimension_count = int(partial_rotary_factor *
hidden_size) // num_attention_heads`` -- from the hidden size, not head_dim
-- and nemotron.cpp creates ``attn_q`` as ``{n_embd, n_embd}``: a head_dim
other than ``hidden / heads`` (HF allows one) gives a file llama.cpp refuses
("wrong shape"), judged against HF alone (the test shows both sides).
``layer_norm_epsilon`` is written from ``norm_eps`` (and, by TextModel, the RMS
eps key from it too, which nemotron.cpp does not read).

Tiny config: 4 heads of 16 (= 64 / 4), 8 channels rotated, biases on.
"""

from __future__ import annotations

from .._gguf_export import NormPlusOne
from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, text_model_gguf_params
from harness.lazy import lazy

gguf = lazy("gguf")


class Nemotron(NormPlusOne, LlamaLike):
    name = "nemotron"
    hf_model_type = "nemotron"
    description = "LayerNorm1P with bias, partial neox RoPE (0.5), all biases"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta", "bias")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        norm_eps=1e-5, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "nemotron"
    input_norm_kind = "layer"  # NemotronLayerNorm1P: F.layer_norm with weight + 1 (see layer_weights)
    weight_map = {**LlamaLike.weight_map, "input_layernorm.bias": "attn_norm_b"}

    def norm_eps(self, config) -> float:
        return config.norm_eps

    def layer_weights(self, model, config, i: int):
        w = super().layer_weights(model, config, i)
        # NemotronLayerNorm1P.forward: F.layer_norm(..., self._weight + 1.0, self.bias)
        w["attn_norm"] = w["attn_norm"] + 1.0
        return w

    def gguf_params(self, w, config, variant=None):
        # conversion/nemotron.py NemotronModel.set_gguf_parameters: TextModel's (the RMS eps
        # key from norm_eps), vocab size, layer_norm_eps, the rope width from the hidden
        # size, and the rope scaling type (NONE without a factor)

        text_model_gguf_params(w, config)
        w.add_vocab_size(config.vocab_size)
        w.add_layer_norm_eps(config.norm_eps)
        rp = dict(config.rope_parameters or {})
        w.add_rope_dimension_count(int(rp["partial_rotary_factor"] * config.hidden_size) // config.num_attention_heads)
        factor = rp.get("factor")
        if factor is None:
            w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        else:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(factor)

    def config_from_gguf(self, meta, shapes, tensors):
        # nemotron.cpp load_arch_hparams: the LayerNorm eps; the rotated width is
        # rope.dimension_count (HF's partial_rotary_factor)
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, rotary=False)
        kw.pop("head_dim", None)
        if hp.n_embd_head_k * hp.head != hp.n_embd:
            meta.refuse("attention.key_length", hp.n_embd_head_k, "a head width other than hidden / heads: the "
                        "converter's rope width assumes hidden / heads")
        kw["norm_eps"] = meta.get_f32("attention.layer_norm_epsilon")
        kw["rope_parameters"]["partial_rotary_factor"] = hp.n_rot / hp.n_embd_head_k
        return kw


FAMILY = Nemotron()
