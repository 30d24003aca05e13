"""bitnet: the attention sub-norm (HF ``BitNetForCausalLM``; llama.cpp
``src/models/bitnet.cpp``, converter ``conversion/bitnet.py`` ``BitnetModel``).

``BitNetAttention.forward``: ``attn_sub_norm`` -- an RMS norm over the
concatenated heads of one row, with a weight -- between the attention and
``o_proj`` (bitnet.cpp: ``build_norm(cur, attn_sub_norm, ...)`` on build_attn's
output, then ``wo``). Plain llama otherwise: GQA, full neox RoPE, RMS input
norm, no biases.

What each side computes with its weights:
- The converter ternarizes q/k/v/o and the FFN matrices (``weight_quant``: per
  tensor ``s = mean|W|``, ``round(W / s).clamp(-1, 1) * s``) and stores the
  result as float; llama.cpp uses the stored weights as they are (no
  ternarization at load) and, with F32 weights, does not quantize activations.
- HF built from a config uses plain ``nn.Linear`` (no ``BitLinear``: that needs
  a checkpoint's ``quantization_config``), so it neither ternarizes weights nor
  quantizes activations.
So that every side computes the same thing, ``init_weights`` draws the seeded
weights and ternarizes those seven matrices exactly as the converter does; HF,
impl and the GGUF all hold the same ternary values. The export writes them
unchanged: applying ``weight_quant`` a second time is NOT the identity (a
ternary tensor with zeros has ``mean|W| = s * (non-zero fraction)``, so the
second pass rescales it), so what the converter would write from the original
draw is what HF already holds (``harness/families/bitnet/test_bitnet.py`` pins this).

llama.cpp's bitnet graph hard-codes SiLU in the FFN (``LLM_FFN_SILU``) while HF
BitNet defaults to ``hidden_act="relu2"``; the tiny config sets ``silu`` so the
references agree. The HF-only setting is exercised by a second config,
``--set hidden_act=relu2``: impl still matches both references on every
attention probe (teacher forced), and the llama.cpp-vs-HF disagreement it
causes from the first FFN on is a ``[[finding]]`` in fixtures/tolerance.toml.

Tiny config: 3 layers, hidden 64, 4 heads / 2 KV heads of 16 (the sub-norm
needs ``n_heads * head_dim == hidden_size``: HF builds it over hidden_size and
llama.cpp's tensor shapes hard-code it), tied embeddings (llama.cpp's bitnet
has no ``output`` tensor; the logits use ``tok_embd``).
"""

from __future__ import annotations

from contract.layers import NormSpec

from ..base import LcPoint, LlamaLike, gguf_size_params
from harness.lazy import lazy

torch = lazy("torch")
gguf = lazy("gguf")

# the HF modules the converter ternarizes (ATTN_Q/K/V/OUT, FFN_UP/DOWN/GATE)
TERNARY = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
           "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def weight_quant(w):
    """conversion/bitnet.py ``BitnetModel.weight_quant``, step for step (float32, per
    tensor): scale = mean|W| clamped at 1e-5, round(W / scale) clamped to [-1, 1],
    times the scale (as the converter writes it: ``/ (1 / scale)``)."""

    t = torch.as_tensor(w)
    dtype = t.dtype
    t = t.float()
    scale = t.abs().mean().clamp(min=1e-5)
    iscale = 1 / scale
    return ((t * iscale).round().clamp(-1, 1) / iscale).type(dtype)


class BitNet(LlamaLike):
    name = "bitnet"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta")}
    hf_model_type = "bitnet"
    description = "attention sub-norm before wo; ternary (converter-quantized) weights"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, hidden_act="silu",
    )
    gguf_arch = "bitnet"
    # BitNetAttention reads getattr(config, "head_dim", hidden // heads), but attn_sub_norm is
    # built over hidden_size, so any other head_dim breaks HF's forward: not offered to --set
    extra_settable = ()
    weight_map = {**LlamaLike.weight_map, "self_attn.attn_sub_norm.weight": "sub_norm"}
    # bitnet.cpp: build_attn's `kqv_out` (wo = NULL) -> `attn_sub_norm` -> wo -> `attn_out`;
    # the residual add is `ffn_inp`
    lc_points = {**LlamaLike.lc_points, "attn_branch": LcPoint("attn_sub_norm"), "resid_mid": LcPoint("ffn_inp")}

    def init_weights(self, model, seed: int) -> None:
        """The seeded draw, then the converter's ternarization of the seven matrices
        (see the module docstring: HF, impl and llama.cpp then share one set of weights)."""

        super().init_weights(model, seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(TERNARY):
                    p.copy_(weight_quant(p.detach()))

    def layer_config(self, config, i: int):
        # BitNetAttention.attn_sub_norm = BitNetRMSNorm(hidden_size, eps=rms_norm_eps): a
        # plain-weight RMS norm (LlamaRMSNorm's arithmetic) over the whole row of heads
        return super().layer_config(config, i).replace(sub_norm=NormSpec("rms", config.rms_norm_eps))

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/base.py TextModel.set_gguf_parameters for BitNetConfig (no head_dim
        field, so no key/value length), then BitnetModel's no-op linear scaling."""

        gguf_size_params(w, config)
        w.add_rope_freq_base(config.rope_parameters["rope_theta"])
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0)

    def gguf_convert(self, name, data, config, variant=None):
        if name == "lm_head.weight":
            # tied to embed_tokens; the BITNET arch has no OUTPUT tensor (gguf-py
            # constants.py) and bitnet.cpp multiplies by tok_embd
            return
        # the converter's tensor map knows the sub-norms only under the 1bitLLM
        # checkpoint names (tensor_mapping.py ATTN_SUB_NORM <- self_attn.inner_attn_ln,
        # FFN_SUB_NORM <- mlp.ffn_layernorm); HF transformers names them
        # attn_sub_norm / ffn_sub_norm
        name = name.replace("self_attn.attn_sub_norm.", "self_attn.inner_attn_ln.")
        name = name.replace("mlp.ffn_sub_norm.", "mlp.ffn_layernorm.")
        # BitnetModel.modify_tensors ternarizes q/k/v/o/gate/up/down: done once, in
        # init_weights, on the original draw (a second weight_quant is not the identity)
        yield name, data

    def config_from_gguf(self, meta, shapes, tensors):
        # bitnet.cpp load_arch_hparams: the RMS eps (the default reverse); the graph's
        # FFN is SiLU-gated whatever HF's config says (build_ffn LLM_FFN_SILU) and the
        # head is always token_embd
        kw = super().config_from_gguf(meta, shapes, tensors)
        kw.update(hidden_act="silu", tie_word_embeddings=True)
        return kw


FAMILY = BitNet()
