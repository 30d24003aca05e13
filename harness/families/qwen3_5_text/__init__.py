"""qwen3_5_text: Qwen3.5's text model (HF ``Qwen3_5ForCausalLM``; llama.cpp
``src/models/qwen35.cpp``, converter ``conversion/qwen.py``
``Qwen3_5TextModel``).

The attention layers are qwen3_next's (``harness.families.qwen3_next``): the
interleaved Q gate, ``(1 + w)`` RMS norms on the input and per head on Q/K
before RoPE, partial neox RoPE. What differs: a dense SwiGLU FFN, the
delta-net's separate ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` /
``in_proj_a`` projections (each one role of impl's gated delta-net: no split),
llama.cpp's value heads in tiled order (the converter reorders them; the probes
are put back in HF's grouped order, ``lc_v_head_order``), and MRoPE. For text every position row is the same
(HF ``Qwen3_5TextModel.forward`` expands one row to T/H/W; llama.cpp builds
``[p, p, p, 0]``), so the rotation is plain partial neox RoPE in both -- as
long as the sections cover every rotated pair: llama.cpp's interleaved MRoPE
(``LLAMA_ROPE_TYPE_IMROPE``) gives a pair outside ``3 * section`` the fourth
position, 0, and ggml's CPU rope asserts ``sum(sections) <= head_dim``. The
tiny config therefore names ``mrope_section=[2, 1, 1]`` (the HF default
``[11, 11, 10]`` aborts llama.cpp at head_dim 16): 4 rotated pairs, t/h/w/t.

Tiny config: 4 layers ``[linear, attention, linear, attention]``, hidden 64,
4 heads / 2 KV heads of 16, rotary on 8 channels, delta-net with 2 key heads
and 4 value heads (so the converter's V-head reorder is exercised).
"""

from __future__ import annotations

import numpy as np

from ..base import LcPoint, tensor
from ..qwen3_next import GatedHybrid
from contract.recurrent import RecurrentConfig
from .._gguf_import import read_hparams


def _reorder_v_heads(t: np.ndarray, dim: int, nk: int, nv_per_k: int, hd: int) -> np.ndarray:
    """conversion/qwen.py ``_LinearAttentionVReorderBase._reorder_v_heads``: V heads
    from grouped-by-key-head ``[G0_v0..v(r-1), G1_v0..]`` to tiled
    ``[G0_v0, G1_v0, G0_v1, ...]`` along ``dim``."""
    shape = list(t.shape)
    dim = dim % len(shape)
    new = shape[:dim] + [nk, nv_per_k, hd] + shape[dim + 1:]
    return np.swapaxes(t.reshape(new), dim, dim + 1).reshape(shape)


class Qwen35Text(GatedHybrid):
    name = "qwen3_5_text"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "qwen3_5_text"
    description = "hybrid: gated attention (interleaved Q gate, (1+w) norms, partial MRoPE) + delta-net layers"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        tie_word_embeddings=False,
    )
    gguf_arch = "qwen35"
    _lc_q_view = "Qcur_reshaped"  # qwen35.cpp build_layer_attn
    _reorder_v_heads = True  # what the converter does; a test switches it off
    # qwen35.cpp names beta after its sigmoid (qwen3next.cpp only the pre-sigmoid `b`)
    _lc_linear_points = {**GatedHybrid._lc_linear_points, "rec_beta": LcPoint("beta_sigmoid", "last", "heads")}

    def _recurrent_weights(self, layer, config) -> dict:
        """Qwen3_5GatedDeltaNet's split projections, each one role already."""
        return {"w_in": tensor(layer, "linear_attn.in_proj_qkv.weight"),
                "w_z": tensor(layer, "linear_attn.in_proj_z.weight"),
                "w_beta": tensor(layer, "linear_attn.in_proj_b.weight"),
                "w_decay": tensor(layer, "linear_attn.in_proj_a.weight")}

    def ggml_input_orders(self, desc) -> dict:
        """``out_proj``'s input columns are the value heads, which the converter stores
        tiled (``_reorder_v_heads(data, 1, ...)``): the file's column j = (i Hk + g) Dv + d
        is impl's (g r + i) Dv + d -- ggml rounds ``final_output`` in that order."""

        if not isinstance(desc, RecurrentConfig) or not self._reorder_v_heads or desc.n_k_heads == desc.n_v_heads:
            return {}
        nk, r, dv = desc.n_k_heads, desc.n_v_heads // desc.n_k_heads, desc.v_dim
        grouped = np.arange(desc.n_v_heads * dv).reshape(nk, r, dv)
        return {"wo": np.ascontiguousarray(grouped.transpose(1, 0, 2)).reshape(-1)}

    def lc_v_head_order(self, config) -> str:
        """The converter reorders the value heads grouped -> tiled where key and value
        heads differ (conversion/qwen.py ``_LinearAttentionVReorderBase``), and
        qwen35.cpp / ggml's ``gated_delta_net`` read them tiled (``iv1 % neq1``)."""
        nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
        return "tiled" if self._reorder_v_heads and nk != nv else "grouped"
    # qwen35.cpp graph(): the embeddings are renamed `model.input_embed`
    lc_model_points = {
        "embeddings": LcPoint("model.input_embed"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }

    def gguf_params(self, w, config, variant=None):
        self._params_common(w, config)
        rp = dict(config.rope_parameters or {})
        if "mrope_section" not in rp:
            # _Qwen35MRopeMixin: the upstream default when the checkpoint names none
            w.add_rope_dimension_sections([11, 11, 10, 0])

    def config_from_gguf(self, meta, shapes, tensors):
        """qwen35.cpp load_arch_hparams: the hybrid keys and the (required) MRoPE
        sections; the graph runs interleaved MRoPE (LLAMA_ROPE_TYPE_IMROPE), which
        for text -- every position the same on each axis -- is the plain
        rotation of the sectioned channels."""

        hp = read_hparams(meta)
        return self._with_mrope(meta, self._hybrid_config(meta, shapes, hp, moe=False))

    def _with_mrope(self, meta, kw: dict) -> dict:
        """``kw`` (the hybrid's config) with a qwen35 / qwen35moe file's (required)
        ``rope.dimension_sections`` as HF's interleaved mrope_section."""
        sections = [int(s) for s in meta.get_per_layer("rope.dimension_sections", 4)]
        kw["rope_parameters"].update(mrope_section=sections[:3], mrope_interleaved=True)
        return kw

    def gguf_convert(self, name, data, config, variant=None):
        """_LinearAttentionVReorderBase.modify_tensors (V heads to tiled order), then
        Qwen3NextModel.modify_tensors (A_log, dt_bias, conv1d, norm + 1)."""
        nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
        if self._reorder_v_heads and nk != nv and "linear_attn." in name:
            hk, hv, r = config.linear_key_head_dim, config.linear_value_head_dim, nv // nk
            if ".in_proj_qkv." in name:
                qk = 2 * hk * nk
                data = np.concatenate([data[:qk], _reorder_v_heads(data[qk:], 0, nk, r, hv)], axis=0)
            elif ".in_proj_z." in name:
                data = _reorder_v_heads(data, 0, nk, r, hv)
            elif ".in_proj_b." in name or ".in_proj_a." in name:
                data = _reorder_v_heads(data, 0, nk, r, 1)
            elif ".A_log" in name or ".dt_bias" in name:
                data = _reorder_v_heads(data[:, None], 0, nk, r, 1)[:, 0]
            elif ".conv1d" in name:
                sq = data.squeeze()
                qk = 2 * hk * nk
                data = np.concatenate([sq[:qk], _reorder_v_heads(sq[qk:], 0, nk, r, hv)], axis=0)
            elif ".out_proj." in name:
                data = _reorder_v_heads(data, 1, nk, r, hv)
        yield from super().gguf_convert(name, data, config, variant)


FAMILY = Qwen35Text()
