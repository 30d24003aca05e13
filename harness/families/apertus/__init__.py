"""apertus: Apertus -- llama's attention with a per-head RMS QK norm before
RoPE, its own norm names, and an ungated xIELU MLP (HF ``ApertusForCausalLM``,
transformers/models/apertus/modular_apertus.py; llama.cpp arch ``apertus``,
src/models/apertus.cpp; converter conversion/llama.py ``ApertusModel``).

HF:
- ``ApertusAttention.forward``: ``q_norm`` / ``k_norm`` (RMS over head_dim)
  on the projections, THEN ``apply_rotary_pos_emb`` (neox);
- ``ApertusDecoderLayer``: ``attention_layernorm`` before the attention,
  ``feedforward_layernorm`` before the MLP (llama's two norms, renamed);
- ``ApertusMLP`` (NemotronMLP): ``down_proj(act_fn(up_proj(x)))``, no gate;
  ``act_fn`` is ``XIELUActivation`` (transformers/activations.py): learned
  ``alpha_p`` / ``alpha_n`` (softplus-parametrised), buffers ``beta`` / ``eps``;
  ``x > 0: alpha_p' x^2 + beta x``, else ``(expm1(min(x, eps)) - x) alpha_n' +
  beta x`` with ``alpha_p' = softplus(alpha_p)``, ``alpha_n' = beta +
  softplus(alpha_n)``.

llama.cpp (apertus.cpp): RMS ``attn_norm``; ``Qcur_normed`` / ``Kcur_normed``
(``attn_q_norm`` / ``attn_k_norm``), then NEOX RoPE (``Qcur_pos``); the FFN
``ffn_up`` -> ``ggml_xielu(up, alpha_n[il], alpha_p[il], beta[il], eps[il])``
(ggml.c ``ggml_xielu``: ``beta + softplus(alpha_n)``, ``softplus(alpha_p)`` --
HF's parametrisation) -> ``ffn_down``; ``load_arch_hparams`` reads the four
per-layer arrays (``xielu.alpha_n`` ...). The MLP is not impl's, but it is in
every layer's output, which the references are compared on.

Converter (``ApertusModel(LlamaModel)``, ``undo_permute = False``: no Q/K
permutation): LlamaModel's keys, llama3 RoPE as a ``rope_freqs`` tensor, and
each layer's ``act_fn.{alpha_n, alpha_p, beta, eps}`` -- tensors in the HF
checkpoint -- turned into the four key arrays (``modify_tensors``).

Tiny config: 2 layers, 4 heads, 2 KV heads, head_dim 16, plain RoPE (llama3's
rope_freqs path is llama's), seeded xIELU parameters per layer.
"""

from __future__ import annotations

import numpy as np

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import trace_import
from ..base import LcPoint, LlamaLike, Point, tensor
from harness.lazy import lazy

activations = lazy("transformers.activations")

_ACT = ("alpha_n", "alpha_p", "beta", "eps")  # HF XIELUActivation's names = the GGUF keys' (xielu.<name>)


class Apertus(LlamaLike):
    name = "apertus"
    hf_model_type = "apertus"
    description = "per-head QK RMS norm before RoPE, renamed norms, xIELU MLP (per-layer parameters as GGUF keys)"
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    gguf_arch = "apertus"
    converter_rope_freqs = True  # ApertusModel(LlamaModel).generate_extra_tensors
    # ApertusAttention: q_norm / k_norm over the head, before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    weight_map = {**{k: v for k, v in LlamaLike.weight_map.items() if k != "input_layernorm.weight"},
                  "attention_layernorm.weight": "attn_norm"}
    # ApertusDecoderLayer: the residual after attention is feedforward_layernorm's input
    hf_points = {**LlamaLike.hf_points, "resid_mid": Point("feedforward_layernorm", "in")}
    # apertus.cpp: cb(Qcur, "Qcur_pos") / cb(Vcur, "Vcur_pos") rename the RoPE'd Q / K and V
    lc_points = {**LlamaLike.lc_points, "v": LcPoint("Vcur_pos", "last", "heads"),
                 "q_rope": LcPoint("Qcur_pos", "last", "heads"), "k_rope": LcPoint("Kcur_pos", "last", "heads")}

    _write_xielu_from_weights = True  # what the converter does; a test writes HF's init instead

    def init_value(self, name, p, r):
        if name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):
            # around HF's init (softplus^-1 of 0.8 and of 0.8 - beta), seeded per layer
            return p.detach().to(r.dtype) + 0.1 * r
        return super().init_value(name, p, r)

    def gguf_model_params(self, w, model, config, variant=None):
        # conversion/llama.py ApertusModel.modify_tensors: each layer's act_fn scalars
        # (.item() in float32), gathered into one array per name
        for key in _ACT:
            vals = [float(np.float32(tensor(layer, f"mlp.act_fn.{key}").reshape(-1)[0]))
                    for layer in self.decoder_layers(model)]
            if not self._write_xielu_from_weights:  # XIELUActivation.__init__'s values, every layer

                vals = [float(np.float32(tensor(activations.XIELUActivation(dtype=__import__("torch").float32), key)
                                         .reshape(-1)[0]))] * len(vals)
            getattr(w, f"add_xielu_{key}")(vals)

    def gguf_convert(self, name, data, config, variant=None):
        if ".mlp.act_fn." in name:
            return  # key arrays (gguf_model_params), not tensors
        yield from super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """apertus.cpp load_arch_hparams: the RMS eps and the four xIELU arrays, one value
        per layer; HF keeps them in the model (act_fn parameters and buffers), so they
        travel in the config to ``gguf_import_tensors``."""
        kw = super().config_from_gguf(meta, shapes, tensors)
        n = kw["num_hidden_layers"]
        kw["xielu"] = {key: [float(v) for v in meta.get_per_layer(f"xielu.{key}", n)] for key in _ACT}
        return kw

    def gguf_import_tensors(self, tensors, model, config, variant=None, path="", provenance=None):
        out = trace_import(self, self.gguf_import_prepare(dict(tensors), config), _WithoutAct(model), config,
                           variant, path, provenance)
        xielu = getattr(config, "xielu", None)
        if xielu is None:
            # the case's own model with its export's quantized weights (gguf/weights.py
            # dequantized_model): its act_fn values are the file's keys, which no weight type rounds
            return out
        sd = model.state_dict()
        for i in range(config.num_hidden_layers):
            for key in _ACT:
                name = f"model.layers.{i}.mlp.act_fn.{key}"
                out[name] = np.full(tuple(sd[name].shape), xielu[key][i], dtype=np.float32)
        return out


class _WithoutAct:
    """``model`` as trace_import sees it: its state dict without the xIELU scalars (in
    the file as keys, not tensors)."""

    def __init__(self, model):
        self._model = model

    def state_dict(self):
        return {k: v for k, v in self._model.state_dict().items() if ".mlp.act_fn." not in k}

    def named_buffers(self):
        # trace_import keeps a buffer the export drops as the model's own (_gguf_import.py)
        return ((n, b) for n, b in self._model.named_buffers() if ".mlp.act_fn." not in n)

    def get_input_embeddings(self):
        return self._model.get_input_embeddings()


FAMILY = Apertus()
