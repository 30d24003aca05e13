"""lfm2: LiquidAI's hybrid of short-conv and attention layers (HF
``Lfm2ForCausalLM``, modeling_lfm2.py; llama.cpp arch ``lfm2``, src/models/lfm2.cpp;
converter conversion/lfm2.py ``LFM2Model``).

The conv layers (``layer_types == "conv"``, HF ``Lfm2ShortConv``; llama.cpp
``build_shortconv_block``) are ``contract.recurrent.RecurrentConfig`` kind
``short_conv``: ``in_proj`` -> B | C | x (thirds), ``B * x`` through a depthwise
causal conv of ``conv_L_cache`` rows (no activation), ``C * conv``, ``out_proj``.
The conv's last ``L - 1`` rows are the layer's whole state (no recurrence).
The attention layers (``Lfm2Attention``) are llama-shaped with a per-head RMS
norm on Q and K before neox RoPE (``q_layernorm`` / ``k_layernorm``) and
``out_proj`` for ``o_proj``; the decoder layer's input norm is
``operator_norm``, the FFN's ``ffn_norm``, the final norm ``embedding_norm``
(applied after the last layer, GGUF ``token_embd_norm``: lfm2.cpp's
``LLM_TENSOR_OUTPUT_NORM_LFM2``).

llama.cpp names (``cb()`` with a literal ``{}``): ``model.layers.{}.operator_norm``,
``model.layers.{}.conv.in_proj`` (B | C | x: C is ``rec_z``), ``model.layers.{}.conv.conv``
(the conv output), ``model.layers.{}.conv.out_proj``, ``l_out``; ``B * x``, the C
product and the residual add are unnamed (not exposed), the conv state comes from
``llama_state_seq_get_data``. Attention: ``Qcur`` / ``Kcur`` / ``Vcur`` (build_qkv),
``model.layers.{}.self_attn.q_layernorm`` / ``k_layernorm``, ``kq_soft_max``,
``kqv_out``, ``model.layers.{}.self_attn.out_proj``.

HF-only setting: ``--set conv_bias=true`` (biases on ``in_proj``, the conv and
``out_proj``): lfm2.cpp loads no bias tensor for the conv layers and refuses the
file, an error row for ``--ref llamacpp``.

Tiny config: 3 layers ``[conv, attention, conv]``, hidden 64, 4 heads / 2 KV heads
of 16, ``conv_L_cache`` 3, a dense SwiGLU FFN of 96 (``block_auto_adjust_ff_dim``
off: HF's and the converter's adjustments agree only at the defaults).
"""

from __future__ import annotations

import dataclasses

from contract.recurrent import RecurrentConfig
from contract.layers import NormSpec, QkNormSpec

from ...errors import UsageError
from .._gguf_export import text_model_gguf_params
from .._recurrent import RecurrentProbes
from ..base import LcPoint, LlamaLike, Point, tensor
from .._gguf_import import read_hparams, full_rotary, hf_rope, one_head_dim, refuse_experts, special_tokens, vocab_of

# llama.cpp's lfm2 graph names its tensors with a literal "{}" (cb(cur, "model.layers.{}.conv.in_proj", il))
L = "model.layers.{}."


class Lfm2(RecurrentProbes, LlamaLike):
    name = "lfm2"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "lfm2"
    description = "hybrid: short-conv layers (B * x conv, C gate) + attention with per-head QK norms"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5,
        conv_L_cache=3, conv_bias=False, block_auto_adjust_ff_dim=False,
        layer_types=["conv", "full_attention", "conv"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "lfm2"
    extra_settable = ()

    # the conv module and its HF probe points (the conv itself is a function: recurrent_taps)
    hf_rec_module = "conv"
    hf_rec_gate_norm = None
    _hf_conv_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("conv", "in"),
        "rec_z": Point("conv.in_proj", "out"),  # B | C | x: C is the middle third (hf_canonical)
        "attn_branch": Point("conv.out_proj", "in"),
        "attn_out": Point("conv", "out"),
        "resid_mid": Point("ffn_norm", "in"),
        "layer_out": Point("", "out"),
    }
    # Lfm2DecoderLayer: operator_norm -> self_attn (out_proj) -> + residual -> ffn_norm
    hf_points = {**LlamaLike.hf_points, "attn_branch": Point("self_attn.out_proj", "in"),
                 "resid_mid": Point("ffn_norm", "in")}
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.embedding_norm", "out")}

    _lc_conv_points = {
        "attn_in": LcPoint(L + "operator_norm"),
        "rec_z": LcPoint(L + "conv.in_proj"),
        "rec_conv": LcPoint(L + "conv.conv"),
        "attn_out": LcPoint(L + "conv.out_proj"),
        "layer_out": LcPoint("l_out"),
    }
    # build_attn_block: the QK norms are cb'd after build_qkv's Qcur / Kcur; the RoPE nodes
    # carry no name of their own; build_attn names kq_soft_max and kqv_out; the residual add
    # is unnamed (resid_mid not exposed; attn_out is named)
    lc_points = {
        "attn_in": LcPoint(L + "operator_norm"),
        "q": LcPoint("Qcur", "last", "heads"),
        "k": LcPoint("Kcur", "last", "heads"),
        "v": LcPoint("Vcur", "last", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint(L + "self_attn.out_proj"),
        "layer_out": LcPoint("l_out"),
    }
    lc_model_points = {
        "embeddings": LcPoint("model.embed_tokens"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }

    # Lfm2Attention: q_layernorm / k_layernorm = Lfm2RMSNorm(head_dim), before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    weight_map = {
        "operator_norm.weight": "attn_norm",
        "self_attn.q_proj.weight": "wq",
        "self_attn.k_proj.weight": "wk",
        "self_attn.v_proj.weight": "wv",
        "self_attn.out_proj.weight": "wo",
        "self_attn.q_layernorm.weight": "q_norm",
        "self_attn.k_layernorm.weight": "k_norm",
    }

    def norm_eps(self, config) -> float:
        return config.norm_eps

    def is_recurrent(self, config, i: int) -> bool:
        return config.layer_types[i] == "conv"

    def validate(self, kw: dict) -> None:
        """The conv's kernel, by its HF name, before HF builds a model on it."""
        super().validate(kw)
        k = kw.get("conv_L_cache", self.tiny.get("conv_L_cache"))
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise UsageError(f"conv_L_cache={k!r}: the short conv needs a kernel of at least 1 row; "
                             f"valid: an integer >= 1")

    def lc_refusal(self, config) -> str | None:
        """lfm2.cpp's short conv keeps L - 1 rows of state: ``build_shortconv_block``
        ``GGML_ASSERT(hparams.n_shortconv_l_cache > 1)`` aborts on a kernel of one row."""
        if config.conv_L_cache < 2:
            return (f"conv_L_cache={config.conv_L_cache}: llama.cpp's short conv asserts a kernel of at least 2 rows "
                    f"(lfm2.cpp GGML_ASSERT(hparams.n_shortconv_l_cache > 1)); valid for --ref llamacpp: >= 2 "
                    f"(HF computes a kernel of 1: --ref hf or hf_cached)")
        return None

    def layer_config(self, config, i: int):
        if self.is_recurrent(config, i):
            # HF Lfm2ShortConv: in_proj (3 x hidden) and out_proj carry conv_bias, and so does the conv
            b = bool(config.conv_bias)
            return RecurrentConfig.of("short_conv", hidden_size=config.hidden_size, conv_kernel=config.conv_L_cache,
                                      conv_bias=b, in_bias=b, out_bias=b, input_norm=NormSpec("rms", config.norm_eps))
        return super().layer_config(config, i)

    def layer_weights(self, model, config, i: int):
        if not self.is_recurrent(config, i):
            return super().layer_weights(model, config, i)
        layer = self.decoder_layers(model)[i]
        h = config.hidden_size
        w_in = tensor(layer, "conv.in_proj.weight")  # HF BCx.chunk(3): B | C | x
        w = {"attn_norm": tensor(layer, "operator_norm.weight"), "w_bx": w_in[:h], "w_z": w_in[h:2 * h],
             "w_in": w_in[2 * h:], "conv": tensor(layer, "conv.conv.weight")[:, 0], "wo": tensor(layer, "conv.out_proj.weight")}
        if config.conv_bias:
            b = tensor(layer, "conv.in_proj.bias")
            w.update(b_bx=b[:h], b_z=b[h:2 * h], b_in=b[2 * h:], conv_b=tensor(layer, "conv.conv.bias"),
                     bo=tensor(layer, "conv.out_proj.bias"))
        return w

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int):
        return self._hf_conv_points if self.is_recurrent(config, i) else self.hf_points

    def hf_canonical(self, probe, arr, lc):
        if isinstance(lc, RecurrentConfig) and probe == "rec_z" and arr.shape[-1] == 3 * lc.hidden_size:
            h = lc.hidden_size
            return arr[..., h:2 * h]  # C of in_proj's B | C | x
        return super().hf_canonical(probe, arr, lc)

    def lc_points_for(self, config, i: int):
        return self._lc_conv_points if self.is_recurrent(config, i) else self.lc_points

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            if probe == "rec_z":
                h = lc.hidden_size
                return arr[..., h:2 * h]  # lfm2.cpp's `c` view of bcx
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        return super().lc_canonical(probe, arr, lc, config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/lfm2.py ``LFM2Model.set_gguf_parameters``: the KV head count per
        layer (0 marks a conv layer: lfm2.cpp ``is_recr_impl[il] = n_head_kv(il) == 0``),
        TextModel's keys, the vocabulary, ``shortconv.l_cache``, the RMS eps from
        ``norm_eps`` and the feed-forward length (``block_auto_adjust_ff_dim`` off: as
        it is)."""
        if config.block_auto_adjust_ff_dim:
            raise ValueError("lfm2 export: block_auto_adjust_ff_dim=true is not exported (HF and the converter "
                             "adjust the width differently unless block_ffn_dim_multiplier is set); valid: false")
        text_model_gguf_params(w, PerLayerKv(config))
        w.add_vocab_size(config.vocab_size)
        w.add_shortconv_l_cache(config.conv_L_cache)
        w.add_layer_norm_rms_eps(config.norm_eps)
        w.add_feed_forward_length(config.intermediate_size)

    def gguf_convert(self, name, data, config, variant=None):
        """LFM2Model.modify_tensors: the conv kernel squeezed (``(C, 1, L)`` -> ``(C, L)``)."""
        if "conv.conv" in name:
            data = data.squeeze(1)
        yield name, data

    def config_from_gguf(self, meta, shapes, tensors):
        """lfm2.cpp load_arch_hparams: ``shortconv.l_cache``, the RMS eps; a layer with no
        KV head is a conv layer."""

        hp = read_hparams(meta)
        kw = self._hybrid_gguf_config(meta, shapes, hp)
        meta.skip("attention.sliding_window", "HF's Lfm2 has no sliding window (lfm2.cpp reads it only when > 0)")
        return kw

    def _hybrid_gguf_config(self, meta, shapes, hp, moe: bool = False) -> dict:
        """What lfm2.cpp reads alike for lfm2 and lfm2moe: the sizes (one head_dim, the
        whole head rotated), the RoPE, the per-layer KV heads (0: a conv layer, one
        count for the attention layers), ``shortconv.l_cache``, the RMS eps."""

        kv = {k for k in hp.n_head_kv if k}
        if len(kv) != 1:
            meta.refuse("attention.head_count_kv", hp.n_head_kv, "one KV head count for the attention layers "
                                                                  "(0 marks a conv layer)")
        # head_count may be per layer too (llama.cpp's random-model generator writes
        # [n_head, 0] for an attention and a conv layer; the saver keeps what it read):
        # lfm2.cpp reads n_head(il) only in the attention layers, so one count there is
        # HF's num_attention_heads and a conv layer's is never used
        heads = {h for h, k in zip(hp.n_head, hp.n_head_kv) if k}
        if len(heads) != 1:
            meta.refuse("attention.head_count", hp.n_head, "one head count for the attention layers")
        n_head = next(iter(heads))
        hp = dataclasses.replace(hp, n_head=[n_head] * hp.n_layer)
        if not moe:
            refuse_experts(meta, hp, self.name)
        vocab = vocab_of(meta, shapes)
        full_rotary(meta, hp, self)
        kw = {"num_hidden_layers": hp.n_layer, "max_position_embeddings": hp.n_ctx_train, "hidden_size": hp.n_embd,
              "intermediate_size": hp.ff, "num_attention_heads": n_head, "num_key_value_heads": kv.pop(),
              "vocab_size": vocab, "tie_word_embeddings": "output.weight" not in shapes,
              "rope_parameters": hf_rope(meta, hp), **one_head_dim(meta, hp, self), **special_tokens(meta, vocab),
              "norm_eps": meta.get_f32("attention.layer_norm_rms_epsilon"),
              "conv_L_cache": int(meta.get("shortconv.l_cache")), "conv_bias": False,
              "layer_types": ["conv" if k == 0 else "full_attention" for k in hp.n_head_kv]}
        if not moe:
            kw["block_auto_adjust_ff_dim"] = False
        return kw


class PerLayerKv:
    """The HF config as conversion/lfm2.py hands it to TextModel.set_gguf_parameters:
    ``num_key_value_heads`` replaced by the per-layer list (0 for a conv layer), so
    ``attention.head_count_kv`` is written once, as an array."""

    def __init__(self, config, attention_type: str = "full_attention"):
        self._config = config
        self.num_key_value_heads = [config.num_key_value_heads if t == attention_type else 0
                                    for t in config.layer_types]

    def __getattr__(self, name):
        return getattr(self._config, name)


FAMILY = Lfm2()
