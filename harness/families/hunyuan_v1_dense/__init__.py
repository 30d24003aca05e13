"""hunyuan_v1_dense: Hunyuan dense -- a per-head RMS QK norm AFTER RoPE, and
NTK-alpha RoPE (HF ``HunYuanDenseV1ForCausalLM``, transformers/models/
hunyuan_v1_dense/modeling_hunyuan_v1_dense.py; llama.cpp ``hunyuan-dense``,
whose graph is ``src/models/hunyuan-vl.cpp``'s (models.h: ``using graph =
llama_model_hunyuan_vl::graph``); converter conversion/hunyuan.py
``HunYuanModel``).

HF:
- ``HunYuanDenseV1Attention.forward``: ``apply_rotary_pos_emb`` (neox), THEN
  ``query_layernorm`` / ``key_layernorm`` (RMS over head_dim); scale
  ``head_dim ** -0.5``; ``attention_bias`` on all four projections;
- ``HunYuanDenseV1RotaryEmbedding``: ``rope_type = "dynamic"`` with an
  ``alpha`` is static NTK ("ntk_alpha"): base ``theta * alpha ** (d / (d - 2))``,
  not recomputed with the length.

llama.cpp: hunyuan-vl.cpp rotates NEOX (no permutation), then ``Kcur_norm`` /
``Qcur_norm`` (``attn_q_norm`` / ``attn_k_norm`` of ``{head_dim}``); no
``attn_output.bias`` (an o_proj bias is refused: ``attention_bias`` is
HF-only). The converter (``HunYuanModel.set_gguf_parameters``): TextModel's
keys, and for ``dynamic`` RoPE the SAME scaled base ``theta * alpha ** (d /
(d - 2))`` as ``rope.freq_base`` with scaling NONE -- and a context length of
256k whatever the config says (it asserts ``rope_theta == 10000`` and
``max_position_embeddings`` in {32k, 256k}); ``alpha`` defaults to 50 there.

Probe map: ``q_rope`` / ``k_rope`` are what enters the attention -- after the
post-RoPE norm (HF's eager query / key; llama.cpp ``Qcur_norm`` / ``Kcur_norm``).

Tiny config: head_dim 16, 4 heads, 2 KV heads, plain RoPE at 1e4; a test runs
the NTK-alpha RoPE (alpha 1000, 32k context) three-way.
"""

from __future__ import annotations

import dataclasses
import copy

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import llama_like_config, read_hparams
from ..base import LcPoint, LlamaLike, rope_from_config, text_model_gguf_params
from harness.lazy import lazy
from .._mla import MlaFamily

gguf = lazy("gguf")


def ntk_alpha_theta(config) -> float:
    """HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters /
    conversion/hunyuan.py: ``theta * alpha ** (dim / (dim - 2))``."""
    rp, dim = config.rope_parameters, config.head_dim
    return rp["rope_theta"] * rp.get("alpha", 50) ** (dim / (dim - 2))


class HunYuanDense(LlamaLike):
    name = "hunyuan_v1_dense"
    hf_model_type = "hunyuan_v1_dense"
    description = "per-head QK RMS norm after RoPE, NTK-alpha RoPE"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2, eod_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "hunyuan-dense"
    # HunYuanDenseV1Attention: query_layernorm / key_layernorm after apply_rotary_pos_emb
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="post_rope")
    weight_map = {**LlamaLike.weight_map, "self_attn.query_layernorm.weight": "q_norm",
                  "self_attn.key_layernorm.weight": "k_norm"}
    qk_norm_names = ("query_layernorm.weight", "key_layernorm.weight")
    lc_points = {**LlamaLike.lc_points,
                 # what enters the attention: after the post-RoPE norm (hunyuan-vl.cpp)
                 "q_rope": LcPoint("Qcur_norm", "last", "heads"),
                 "k_rope": LcPoint("Kcur_norm", "last", "heads")}

    def rope(self, config, i: int, head_dim: int):
        rp = dict(config.rope_parameters or {})
        if rp.get("rope_type") == "dynamic" and rp.get("alpha"):
            # "DynamicNTKAlphaRotary ... a fixed alpha makes the frequencies static": the
            # default rotation at the NTK-scaled base
            spec = rope_from_config(_with_rope(config, {"rope_type": "default", "rope_theta": ntk_alpha_theta(config)}),
                                    layout=self.rope_layout, head_dim=head_dim)
            return dataclasses.replace(spec, kind="ntk_alpha")
        return super().rope(config, i, head_dim)

    def gguf_params(self, w, config, variant=None):
        # conversion/hunyuan.py HunYuanModel.set_gguf_parameters: TextModel's; for a
        # "dynamic" RoPE the scaled base over TextModel's rope.freq_base, scaling NONE,
        # factor 1, and a 256k context (GGUFWriter keeps the later of a duplicated key)

        text_model_gguf_params(w, config)
        rp = dict(config.rope_parameters or {})
        if rp.get("rope_type") in ("dynamic", "xdrope"):
            put = MlaFamily.put
            put(w, "rope.freq_base", ntk_alpha_theta(config), w.add_rope_freq_base)
            w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
            w.add_rope_scaling_factor(1)
            if rp.get("rope_type") == "dynamic":
                w.add_rope_scaling_orig_ctx_len(256 * 1024)
                put(w, "context_length", 256 * 1024, w.add_context_length)

    def config_from_gguf(self, meta, shapes, tensors):
        # hunyuan-vl.cpp load_arch_hparams: the RMS eps and the (optional) M-RoPE sections
        # (HunYuan-VL; refused); the file's base is the (NTK-scaled) one llama.cpp rotates with
        if meta.get("rope.dimension_sections", None):
            meta.refuse("rope.dimension_sections", meta.get("rope.dimension_sections"),
                        "M-RoPE (HunYuan-VL) is not HF HunYuanDenseV1's text RoPE")
        kw = llama_like_config(self, meta, shapes, read_hparams(meta))
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        return kw


def _with_rope(config, rope_parameters: dict):
    """A shallow copy of ``config`` with other rope parameters."""
    c = copy.copy(config)
    object.__setattr__(c, "rope_parameters", rope_parameters)
    return c


FAMILY = HunYuanDense()
