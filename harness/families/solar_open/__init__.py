"""solar_open: Solar Open -- llama's attention (no biases, no QK norm) with
GLM-4.5's sigmoid-routed experts in every layer (HF ``SolarOpenForCausalLM``,
transformers/models/solar_open/modular_solar_open.py; llama.cpp arch
``glm4moe``, src/models/glm4-moe.cpp; converter conversion/glm.py
``SolarOpenModel(Glm4MoeModel)``).

HF: ``SolarOpenAttention`` is ``LlamaAttention`` (o_proj bias-free, q/k/v
biased only with ``attention_bias``, default False): ``apply_rotary_pos_emb``
rotates the WHOLE head (neox pairs; there is no rotated / passed split, so a
``partial_rotary_factor`` other than 1 does not even run: cos / sin are
narrower than q); ``SolarOpenRotaryEmbedding.compute_default_rope_parameters``
reads ``rope_parameters.get("partial_rotary_factor", 1.0)``. Every layer is
``SolarOpenMoE`` (``Glm4MoeMoE``: sigmoid router with ``e_score_correction_bias``,
``n_group`` groups, ``norm_topk_prob``, ``routed_scaling_factor``, one shared
expert).

llama.cpp: glm4-moe.cpp rotates ``LLAMA_ROPE_TYPE_NEOX`` on ``n_rot`` channels
(no permutation), optional Q/K norms (none written), ``attn_post_norm`` is the
pre-FFN norm; every layer from ``leading_dense_block_count`` (absent: 0) is MoE.

THE TRAP: ``Glm4MoeModel.set_gguf_parameters`` (conversion/glm.py:157-159, which
``SolarOpenModel`` inherits) writes ``rope.dimension_count = head_dim *
rope_parameters.get("partial_rotary_factor", 0.5)`` -- GLM-4.5's default, not
HF SolarOpen's 1.0. A config that names no factor (SolarOpenConfig has no such
field; transformers 5 saves ``rope_parameters`` without one) converts to a
model that rotates HALF of each head: a different model from HF's from L0's
q_rope on (findings.toml). This family's export mirrors the converter; its
tiny config names the factor 1.0 (HF's default value, written out), the model
both compute. ``--set rope_parameters.partial_rotary_factor=null`` leaves the
key out (``config_kwargs``), as a checkpoint saved by transformers 5 does.

Tiny config: 4 heads of 16, 2 KV heads, 4 experts of 32 (2 used), one shared
expert, one group, norm_topk_prob true (the config default).
"""

from __future__ import annotations

from contract.layers import ConfigError

from .._gguf_import import experts, llama_like_config, one_per_layer, read_hparams
from ..base import LlamaLike, gguf_moe_convert, text_model_gguf_params
from harness.lazy import lazy

gguf = lazy("gguf")

# conversion/glm.py Glm4MoeModel.set_gguf_parameters: the factor it assumes where
# rope_parameters names none (GLM-4.5's; HF SolarOpen's is 1.0)
CONVERTER_DEFAULT_FACTOR = 0.5


class SolarOpen(LlamaLike):
    name = "solar_open"
    hf_model_type = "solar_open"
    description = "llama's attention with sigmoid-routed experts; the converter's partial RoPE default 0.5"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5,
        # written out: the converter's default where it is absent is 0.5 (module docstring)
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 1.0},
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "glm4moe"
    # SolarOpenExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    def rope(self, config, i, head_dim):
        # modeling_solar_open.py apply_rotary_pos_emb: q * cos + rotate_half(q) * sin over the
        # whole head, no rotated / passed split -- a narrower cos / sin does not broadcast
        prf = (config.rope_parameters or {}).get("partial_rotary_factor")
        if prf is not None and prf != 1.0:
            raise ConfigError(f"rope_parameters.partial_rotary_factor={prf}: HF SolarOpen rotates the whole "
                              "head (apply_rotary_pos_emb has no partial split); use 1.0 or null (left out)")
        return super().rope(config, i, head_dim)

    def config_kwargs(self, overrides: dict) -> dict:
        # --set rope_parameters.partial_rotary_factor=null: the key left out, as
        # transformers 5 saves a SolarOpenConfig (HF then reads 1.0, the converter 0.5);
        # HF's get(..., 1.0) would return a None it cannot rotate by
        kw = super().config_kwargs(overrides)
        rp = kw.get("rope_parameters")
        if isinstance(rp, dict) and rp.get("partial_rotary_factor", 0) is None:
            kw["rope_parameters"] = {k: v for k, v in rp.items() if k != "partial_rotary_factor"}
        return kw

    def gguf_params(self, w, config, variant=None):
        # conversion/glm.py Glm4MoeModel.set_gguf_parameters (SolarOpenModel adds none):
        # TextModel's keys, the rope width with the 0.5 default, the routed expert count,
        # the experts' width, the shared count, sigmoid gating, the scale and the norm

        text_model_gguf_params(w, config)
        prf = (config.rope_parameters or {}).get("partial_rotary_factor", CONVERTER_DEFAULT_FACTOR)
        w.add_rope_dimension_count(int(self.head_dim(config) * prf))
        w.add_expert_count(config.n_routed_experts)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_count(config.n_shared_experts)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(config.routed_scaling_factor)
        w.add_expert_weights_norm(config.norm_topk_prob)

    def gguf_convert(self, name, data, config, variant=None):
        # Glm4MoeModel.modify_tensors: the experts stacked per layer (transformers 5's fused
        # gate_up_proj split, gate rows first), e_score_correction_bias renamed; no Q/K
        # permutation ("GLM4V_MOE uses Neox ordering already"); the rest as TextModel maps it
        yield from gguf_moe_convert(name, data) or super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """glm4-moe.cpp load_arch_hparams: the experts' width, the RMS eps, the shared
        count, the leading dense layers, the routed weights' scale and norm, the gating
        (default sigmoid). HF SolarOpen rotates the whole head, routes by sigmoid, has
        every layer MoE and one QK-norm-free attention: a file that says otherwise is
        refused."""
        hp = read_hparams(meta)
        if meta.get("rope.dimension_sections", None):
            meta.refuse("rope.dimension_sections", meta.get("rope.dimension_sections"),
                        "M-RoPE (GLM-4.5V); HF SolarOpen rotates one position")
        if int(meta.get("leading_dense_block_count", 0)):
            meta.refuse("leading_dense_block_count", meta.get("leading_dense_block_count"),
                        "dense layers; every HF SolarOpen layer is MoE")
        if int(meta.get("expert_gating_func", 2)) != 2:
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF SolarOpen routes by sigmoid (2)")
        if "blk.0.attn_q_norm.weight" in shapes:
            meta.refuse("blk.0.attn_q_norm.weight", "present", "HF SolarOpen has no QK norm")
        kw = llama_like_config(self, meta, shapes, hp, moe=True)  # full_rotary: refuses n_rot != head_dim
        n_exp, n_used = experts(meta, hp, self.name)
        kw.pop("intermediate_size", None)  # SolarOpenConfig has none (every layer MoE)
        kw["rope_parameters"]["partial_rotary_factor"] = 1.0
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), n_routed_experts=n_exp,
                  num_experts_per_tok=n_used, n_group=1, topk_group=1,
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  n_shared_experts=int(meta.get("expert_shared_count")),
                  norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                  routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0)
        return kw


FAMILY = SolarOpen()
