"""mistral4: Mistral Small 4's decoder (HF ``Mistral4ForCausalLM``,
transformers/models/mistral4/modeling_mistral4.py; llama.cpp arch ``mistral4``,
src/models/mistral4.cpp: ``llama_model_mistral4 : llama_model_deepseek2``, the deepseek2
graph, hparams and tensors as they are; converter conversion/mistral3.py
``Mistral3Model.Mistral4Model(DeepseekV2Model)``, chosen at run time when the text
config's ``model_type`` is ``mistral4``).

The attention is ``DeepseekV3Attention`` (low-rank Q, the latent norms, the shared rope
slice rotated in interleaved pairs and returned de-interleaved, YaRN's softmax mscale
``yarn_apply_mscale``) plus one thing: ``Mistral4Attention.forward`` multiplies the whole
query, after RoPE, by ``get_llama_4_attn_scale(position_ids, beta,
original_max_position_embeddings)`` = ``1 + beta * log(1 + floor(pos / orig))``
(``rope_parameters["llama_4_scaling_beta"]``: 0.1 in Mistral4Config's default).
impl: ``MlaConfig.temperature`` = ``TemperatureSpec(orig, beta, offset=0)``, applied
after the q_rope / q_absorbed probes, as both references tap them.

What llama.cpp computes differently (findings.toml):

- the temperature: the converter's ``Mistral4Model`` writes no
  ``attention.temperature_scale`` (only the Ministral 3 arm does, conversion/mistral3.py
  ``add_attn_temperature_scale``), so deepseek2.cpp builds no ``inp_attn_scale``: from
  position ``original_max_position_embeddings`` on (8192 in the real config) llama.cpp's
  queries lack HF's factor;
- YaRN's magnitude when ``mscale_all_dim`` != 1: llama-context.cpp takes ``mscale`` =
  ``mscale_all_dim`` for ``LLM_ARCH_DEEPSEEK2`` only ("special-case DEEPSEEK v2"), and 1
  for mistral4, so a config with ``mscale == mscale_all_dim`` != 1 rotates with another
  magnitude than HF's (``MlaFamily.mla_rope_parameters`` reads the arch for it).

The router (``Mistral4TopkRouter``: softmax scores, groups by their top-2 sums, no
correction bias) is deepseek2.cpp's softmax gating, its default when the file names none.

Tiny config: deepseek_v3's attention sizes and experts, YaRN factor 4 over 128 original
positions (mscale = mscale_all_dim = 1, as the real config), beta 0.1: the temperature
is inert below position 128, so a default case is three-way; the temperature's cases set
``original_max_position_embeddings`` lower.
"""

from __future__ import annotations

from contract.layers import TemperatureSpec

from ..deepseek_v3 import DeepseekV3
from harness.lazy import lazy

transformers = lazy("transformers")


class Mistral4(DeepseekV3):
    # what the converter writes no key for (conversion/mistral3.py Mistral4Model: no
    # add_attn_temperature_scale), so a file reads back without it (config_from_gguf)
    _gguf_unwritten = {"rope_parameters.llama_4_scaling_beta": 0.0}

    name = "mistral4"
    hf_model_type = "mistral4"
    description = "Mistral Small 4: DeepSeek V3's MLA with YaRN and the query temperature floor(pos / orig), softmax MoE"
    gguf_arch = "mistral4"
    extra_settable = ()  # Mistral4Config routes by softmax: no scoring_func / topk_method
    fuzz_space = {"knobs": ("mla", "mla_yarn")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True, rope_interleave=True,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128,
                             mscale=1.0, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0,
                             llama_4_scaling_beta=0.1),
    )

    def config_from_kwargs(self, kw: dict, refused: str):
        # transformers 5.24 builds Mistral4ForCausalLM but maps Mistral4Config to it for
        # AutoModelForPreTraining and AutoModelForImageTextToText only, not for
        # AutoModelForCausalLM (models/auto/modeling_auto.py MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        # every path that builds the model (build_model, the GGUF export, the hook points)
        # asks that auto class, so the mapping is added here, where each config is made

        transformers.AutoModelForCausalLM.register(transformers.Mistral4Config, transformers.Mistral4ForCausalLM, exist_ok=True)
        return super().config_from_kwargs(kw, refused)

    def _temperature(self, config) -> TemperatureSpec | None:
        """HF ``get_llama_4_attn_scale(position_ids, beta, original_max_position_embeddings)``:
        ``1 + beta * log(1 + floor(pos / orig))`` -- offset 0; beta 0 is scale 1."""
        rp = config.rope_parameters or {}
        beta = rp.get("llama_4_scaling_beta")
        if not beta:
            return None
        return TemperatureSpec(float(rp["original_max_position_embeddings"]), float(beta), offset=0)

    def layer_config(self, config, i: int, variant: str = "absorbed"):
        return super().layer_config(config, i, variant).replace(temperature=self._temperature(config))

    def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
        sw = super().feature_switches(config, features)
        rp = config.rope_parameters or {}
        # Mistral4Attention reads llama_4_scaling_beta and original_max_position_embeddings
        # from rope_parameters whatever the RoPE type (get_llama_4_attn_scale: None fails),
        # and the temperature is not RoPE; Mistral4RotaryEmbedding rotates head_dim x
        # partial_rotary_factor channels (the rope slice of the nope + rope head): the
        # RoPE switches keep all three
        keep = {k: rp[k] for k in ("llama_4_scaling_beta", "original_max_position_embeddings",
                                   "partial_rotary_factor") if k in rp}
        for tag in [t for t, o in sw.items() if "rope_parameters" in o]:
            sw[tag] = {**sw[tag], "rope_parameters": {**sw[tag]["rope_parameters"], **keep}}
        # no plain-RoPE switch: HF cannot run mistral4 at rope_type default (hf_refusal)
        sw.pop("mla_yarn", None)
        if "mla_temperature" in features:
            sw["mla_temperature"] = {"rope_parameters": {**rp, "llama_4_scaling_beta": 0.0}}  # HF: scale 1
        return sw

    def hf_refusal(self, config) -> str | None:
        if (config.rope_parameters or {}).get("rope_type", "default") == "default":
            return ("rope_type default: HF's Mistral4RotaryEmbedding.compute_default_rope_parameters "
                    "(modeling_mistral4.py 88) makes (qk_nope_head_dim + qk_rope_head_dim) / 2 frequencies, "
                    "ignoring partial_rotary_factor, and its forward fails on the qk_rope slice; valid rope_type: "
                    "yarn (Mistral4Config's default), linear")
        return super().hf_refusal(config)

    def mla_router(self, meta, hp):
        # HF Mistral4TopkRouter: softmax scores (no correction bias), groups by their top-2
        # sums, weights renormalised when norm_topk_prob, times routed_scaling_factor;
        # deepseek2.cpp's softmax gating, its default when the file names none
        gating = self.deepseek2_gating(meta, hp)
        if gating != 1:
            meta.refuse("expert_gating_func", gating, "HF Mistral4 routes by softmax (1)")
        return dict(rope_interleave=True, norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                    n_group=max(hp.n_expert_groups, 1), topk_group=max(hp.n_group_used, 1),
                    routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0)

    def config_from_gguf(self, meta, shapes, tensors):
        """deepseek2.cpp's keys (MlaFamily.config_from_gguf); a file from the converter
        names no temperature, so llama.cpp runs none: beta 0 (HF's scale 1), and the
        original context HF reads it at (YaRN's, or the trained context)."""
        kw = super().config_from_gguf(meta, shapes, tensors)
        rp = dict(kw["rope_parameters"])
        rp.setdefault("original_max_position_embeddings", kw["max_position_embeddings"])
        rp["llama_4_scaling_beta"] = 0.0
        kw["rope_parameters"] = rp
        return kw


FAMILY = Mistral4()
