"""hunyuan_v1_moe: Hunyuan-A13B -- hunyuan_v1_dense's attention (per-head RMS
QK norm AFTER neox RoPE, NTK-alpha RoPE) with softmax-routed experts plus an
ungated shared MLP in every layer (HF ``HunYuanMoEV1ForCausalLM``,
transformers/models/hunyuan_v1_moe/modular_hunyuan_v1_moe.py; llama.cpp arch
``hunyuan-moe``, src/models/hunyuan-moe.cpp; converter conversion/hunyuan.py
``HunYuanMoEModel``).

HF: ``HunYuanMoEV1Attention.forward``: ``apply_rotary_pos_emb``, then
``query_layernorm`` / ``key_layernorm`` (as dense); ``HunYuanMoEV1Gate``
(float32 ``wg``): softmax, top-``moe_topk``, ALWAYS renormalised;
``HunYuanMoEV1Moe``: ``experts(...) + shared_mlp(x)``; the experts
(``MixtralExperts``) and the shared MLP are both ``intermediate_size`` wide --
transformers 5's config has no ``moe_intermediate_size`` nor
``num_shared_expert`` (the hub config.json's per-layer lists, which the
converter reads).

llama.cpp (hunyuan-moe.cpp): NEOX RoPE, ``Kcur_norm`` / ``Qcur_norm`` after it,
``attn_out`` named, the shared MLP (``ffn_*_shexp``, ``n_ff_shexp``) plus
``build_moe_ffn(..., LLM_FFN_SILU, true, ..., SOFTMAX)`` (renormalised, as HF);
``load_arch_tensors`` sizes the experts by ``n_ff`` (``feed_forward_length`` =
``intermediate_size``), not by ``expert_feed_forward_length``.

Converter (``HunYuanMoEModel.set_gguf_parameters``): TextModel's keys, the
shared width ``intermediate_size``, ``expert_feed_forward_length`` =
``moe_intermediate_size[0]``, ``expert_used_count`` = ``moe_topk[0]``,
``expert_shared_count`` = ``num_shared_expert[0]`` (asserting each list is
uniform), and dynamic RoPE's scaled base as dense's. HF's model has one
width for all three, so the hub's lists are ``[intermediate_size] * layers``
and ``[1] * layers`` -- what the export writes.

Tiny config: dense's attention (head_dim 16, 4 heads, 2 KV heads, plain RoPE),
4 experts of 48 (2 used), untied head (the config default).
"""

from __future__ import annotations

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import gguf_moe_convert
from ..hunyuan_v1_dense import HunYuanDense


class HunYuanMoe(HunYuanDense):
    name = "hunyuan_v1_moe"
    hf_model_type = "hunyuan_v1_moe"
    description = "hunyuan's QK norm after RoPE with softmax-routed experts and a shared MLP"
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_experts=4, moe_topk=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, eod_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "hunyuan-moe"
    # MixtralExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def gguf_params(self, w, config, variant=None):
        # conversion/hunyuan.py HunYuanMoEModel.set_gguf_parameters: TextModel's keys (the
        # expert count among them), the shared width, the hub lists' first entries -- HF's
        # one intermediate_size, top-k and one shared MLP (module docstring) -- and the
        # dynamic RoPE's base as dense's HunYuanModel writes it
        super().gguf_params(w, config, variant)
        w.add_expert_shared_feed_forward_length(config.intermediate_size)
        w.add_expert_feed_forward_length(config.intermediate_size)
        w.add_expert_used_count(config.moe_topk)
        w.add_expert_shared_count(1)

    def gguf_convert(self, name, data, config, variant=None):
        # HunYuanMoEModel.modify_tensors stacks the per-expert tensors; transformers 5 holds
        # them fused (gate rows first); mlp.gate.wg and mlp.shared_mlp.* as gguf's map names them
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """hunyuan-moe.cpp load_arch_hparams: the RMS eps, the experts' width (read, but
        the tensors are n_ff wide) and the shared width (default n_ff); HF has one
        width for the experts and the shared MLP, so the file's must agree."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        shexp = int(meta.get("expert_shared_feed_forward_length", hp.ff))
        if shexp != hp.ff:
            meta.refuse("expert_shared_feed_forward_length", shexp,
                        f"HF HunYuanMoEV1's shared MLP is intermediate_size ({hp.ff}) wide")
        one_per_layer(meta, "expert_feed_forward_length", hp.n_layer)  # read; hunyuan-moe.cpp sizes by n_ff
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp, moe_topk=n_used)
        return kw


FAMILY = HunYuanMoe()
