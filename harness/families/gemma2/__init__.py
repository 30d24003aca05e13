"""gemma2: logit softcap, post-attention norm, query_pre_attn_scalar, alternating
sliding window, the ``(1 + w)`` norm convention (HF ``Gemma2ForCausalLM``,
transformers/models/gemma2/modeling_gemma2.py; llama.cpp ``src/models/gemma2.cpp``).

The attention half (``Gemma2DecoderLayer.forward``): ``Gemma2RMSNorm`` input
norm (``x * rsqrt(mean(x^2) + eps) * (1 + w)``, all in float32), q/k/v/o
without biases (``attention_bias`` False), neox RoPE, scores scaled by
``query_pre_attn_scalar ** -0.5`` (``Gemma2Attention.__init__``), then
``softcap * tanh(scores / softcap)`` BEFORE the mask and the softmax
(``eager_attention_forward``), even layers sliding (``layer_types``), then
``post_attention_layernorm`` (a ``(1 + w)`` RMS norm) of the o_proj output
BEFORE the residual add. The embedding is scaled by ``sqrt(hidden)`` inside
``Gemma2TextScaledWordEmbedding``, so ``embed_tokens``'s output is already scaled.

Probe map (HF): ``attn_out`` is ``post_attention_layernorm``'s output (what the
residual adds) and ``resid_mid`` is ``pre_feedforward_layernorm``'s input --
LlamaLike's points would read the un-normed branch and a residual that does not
exist. llama.cpp: ``inp_scaled`` is the scaled embedding (``embd`` is not),
``attn_post_norm`` the normed branch, ``sa_out`` the residual after attention
(gemma2.cpp has no ``attn_out`` and no ``ffn_inp``).

GGUF (conversion/gemma.py ``Gemma2Model``): its own ``set_gguf_parameters``
(no ``super()``: no rope keys at all, so llama.cpp runs rope_theta 10000, the HF
default), ``lm_head.weight`` dropped (llama.cpp's ``output`` duplicates
``token_embd``), every ``*norm.weight`` stored as ``w + 1``.

Configs:
- default: ``query_pre_attn_scalar = head_dim = 16`` (scale 0.25), softcap 5
  (small, so tanh is far from linear), window 4 on layer 0; both references agree.
- HF-only: ``--set query_pre_attn_scalar=24`` (scale 24 ** -0.5). llama.cpp
  never reads query_pre_attn_scalar (gemma2.cpp ``load_arch_hparams``:
  ``f_attention_scale = 1/sqrt(n_embd_head_k)``, or ``1/sqrt(n_embd/n_head)``
  for the 46-layer 27B) and no GGUF key carries it: a ``[[finding]]``.
- HF-only: ``--set rope_parameters.rope_theta=100000``. The converter writes no
  ``rope.freq_base`` (``Gemma2Model.set_gguf_parameters`` does not call
  ``super()``), so llama.cpp rotates with its default base 10000: a ``[[finding]]``.
- HF-only: ``--set layer_types='["full_attention","sliding_attention"]'``. The
  converter writes no layer pattern and llama.cpp slides the even layers
  (``set_swa_pattern(2)``), so a swapped pattern is a ``[[finding]]``.
- HF-only: ``--set attention_bias=true`` puts an o_proj bias BEFORE the
  post-attention norm (the spec's order); llama.cpp gemma2 has no ``wo_b`` and
  refuses the extra tensor, so this one is run against HF only (the mutants use it).
"""

from __future__ import annotations

from contract.layers import LayerConfig

from .._gguf_export import NormPlusOne
from .._gguf_import import llama_like_config, one_theta, read_hparams, swa_pattern
from ..base import LcPoint, LlamaLike, post_norm_points
from ..gemma import gemma_gguf_params

QPAS_24 = (("query_pre_attn_scalar", 24),)  # the HF-only scale config, as overrides
O_BIAS = (("attention_bias", True),)  # the HF-only o_proj-bias config
THETA_1E5 = (("rope_parameters.rope_theta", 100000),)  # the HF-only RoPE base config
SWAPPED_LAYERS = (("layer_types", ["full_attention", "sliding_attention"]),)  # HF-only layer pattern


class Gemma2(NormPlusOne, LlamaLike):
    name = "gemma2"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "window", "softcap")}
    hf_model_type = "gemma2"
    description = "logit softcap, post-attention norm, query_pre_attn_scalar, alternating window, (1+w) norms"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        query_pre_attn_scalar=16,  # = head_dim: llama.cpp's scale (see the module docstring)
        sliding_window=4, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
        max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=True,  # llama.cpp gemma2 has no separate output tensor
    )
    gguf_arch = "gemma2"
    hf_points = post_norm_points("pre_feedforward_layernorm")
    weight_map = {**LlamaLike.weight_map, "post_attention_layernorm.weight": "post_norm"}
    lc_points = {
        **LlamaLike.lc_points,
        "attn_out": LcPoint("attn_post_norm"),
        "resid_mid": LcPoint("sa_out"),
    }
    lc_model_points = {**LlamaLike.lc_model_points, "embeddings": LcPoint("inp_scaled")}

    input_norm_kind = "rms1p"  # Gemma2RMSNorm: (1 + w)
    post_norm_kind = "rms1p"  # post_attention_layernorm, before the residual

    def layer_config(self, config, i: int) -> LayerConfig:
        return super().layer_config(config, i).replace(
            scale=float(config.query_pre_attn_scalar) ** -0.5,  # Gemma2Attention.scaling
            softcap=config.attn_logit_softcapping,  # eager_attention_forward(softcap=...)
        )

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/gemma.py Gemma2Model.set_gguf_parameters, key for key (it does
        # not call super(): no rope.freq_base, no rope scaling, no layer pattern):
        # GemmaModel's keys, then the softcaps and the window
        gemma_gguf_params(w, config)
        w.add_attn_logit_softcapping(config.attn_logit_softcapping)
        w.add_final_logit_softcapping(config.final_logit_softcapping)
        w.add_sliding_window(config.sliding_window)

    def gguf_transform(self, name, data, config):
        if name == "lm_head.weight":  # Gemma2Model.filter_tensors: skipped
            return None
        return data  # Gemma2Model.modify_tensors: norms + 1 (NormPlusOne)


    def config_from_gguf(self, meta, shapes, tensors):
        """gemma2.cpp load_arch_hparams: window 4096 unless the key says otherwise,
        ``load_swa_pattern(ml, 2)`` (every layer has a pattern slot: gemma2 always
        slides its even layers unless the file's array says otherwise),
        ``rope.freq_base_swa`` defaulting to the main base (HF has one theta: a
        different one is refused), the RMS eps, the softcaps (defaults 50 and 30,
        llama_hparams) and the scale ``1/sqrt(head_dim)`` (``n_embd / n_head`` for
        the 46-layer 27B) as ``query_pre_attn_scalar``."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 2)
        one_theta(meta, hp, swa)
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa))
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  sliding_window=int(meta.get("attention.sliding_window", 4096)),
                  attn_logit_softcapping=meta.get_f32("attn_logit_softcapping", 50.0),
                  final_logit_softcapping=meta.get_f32("final_logit_softcapping", 30.0),
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa],
                  query_pre_attn_scalar=hp.n_embd // hp.head if hp.n_layer == 46 else hp.n_embd_head_k,
                  tie_word_embeddings=True)  # gemma2.cpp: output is always token_embd
        return kw


FAMILY = Gemma2()
