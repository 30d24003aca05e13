"""ministral3: Ministral 3 (HF ``Ministral3ForCausalLM``,
transformers/models/ministral3/modeling_ministral3.py) as llama.cpp's
``mistral3`` arch runs it (``src/models/mistral3.cpp``; converter
conversion/mistral3.py ``Mistral3Model.Ministral3Model(LlamaModel)``).

The attention is mistral's (llama's shape, a window on every layer when
``sliding_window`` is set -- off here, the mistral3 family's finding when on)
plus two things:

- YaRN RoPE (``Ministral3Config``'s default ``rope_parameters`` is
  ``{"type": "yarn", "factor": 16, "original_max_position_embeddings": 16384,
  "mscale": 1, "mscale_all_dim": 1, ...}``). The converter asserts
  ``rope_type == "yarn"`` (conversion/mistral3.py, the ``model_type ==
  "ministral3"`` arm) and writes the YaRN keys (conversion/base.py
  ``TextModel.set_gguf_parameters``) plus ``rope.scaling.yarn_log_multiplier
  = mscale_all_dim``; llama-context.cpp computes the attention factor from
  that multiplier ASSUMING ``mscale == 1`` ("note: here we assume `mscale ==
  1.0f`"): an HF ``mscale`` other than 1 is a finding (findings.toml,
  measured at mscale 2: q_rope nmse 0.042).
- The attention temperature, applied to Q after RoPE on every layer:
  ``q *= 1 + beta * log(1 + floor(pos / original_max_position_embeddings))``
  (HF ``get_llama_4_attn_scale`` in ``Ministral3Attention.forward``, beta =
  ``rope_parameters["llama_4_scaling_beta"]``); llama.cpp mistral3.cpp
  ``load_arch_hparams`` sets ``f_attn_temp_offset = 0`` and the floor scale to
  ``n_ctx_orig_yarn``, and the graph multiplies ``Qcur`` by
  ``inp_attn_scale`` after ``ggml_rope_ext`` (cb ``Qcur_attn_temp_scaled``).
  impl: ``TemperatureSpec(floor_scale, beta, offset=0)`` -- llama4's offset is
  1 (``floor((pos + 1) / s)``); the test plants llama4's offset and sees it
  fail at ``q_rope``.

Tiny config: ``original_max_position_embeddings = 8`` so the temperature
floor steps at position 8 inside a 16-token case (and llama4's offset would
step at 7 and 15) (Ministral 3's real 16384
never steps below 16384 tokens: at the real size the decoration is inert at
any length the default matrix runs), YaRN factor 32 = 256 / 8 (as in the real config, 262144 / 16384 = 16),
head_dim 16, beta 0.5. The original context must reach past ``2 pi`` rotations
of the slow band: with 4 positions and head_dim 128 HF's
``find_correction_range`` gives high (-3) < low (0), so HF's ramp ``(i - low) /
(high - low)`` is negative -- all extrapolated -- while ggml's
``rope_yarn_ramp`` divides by ``MAX(0.001, high - low)`` -- all interpolated
(ggml/src/ggml-cpu/ops.cpp): a degenerate YaRN no real model has.
"""

from __future__ import annotations

from contract.layers import TemperatureSpec

from ..mistral3 import Mistral3
from .._gguf_import import hf_rope, read_hparams


class Ministral3(Mistral3):
    name = "ministral3"
    hf_model_type = "ministral3"
    description = "Ministral 3: mistral3's graph with YaRN and the attention temperature floor(pos / s) (offset 0)"
    gguf_arch = "mistral3"
    fuzz_space = {"knobs": ("heads", "head_dim")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
        # Ministral3Config's default rope_parameters, at a scale a 16-token case reaches
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                         "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5},
    )
    # llama.cpp's mistral3.cpp: Q after RoPE, then the temperature multiply
    lc_points = {**Mistral3.lc_points}

    def _temperature(self, config) -> TemperatureSpec | None:
        rp = config.rope_parameters or {}
        beta = rp.get("llama_4_scaling_beta")
        if not beta:
            return None  # HF multiplies by 1 + 0 * log(...) = 1
        # HF get_llama_4_attn_scale(position_ids, beta, original_max_position_embeddings):
        # 1 + beta * log(1 + floor(pos / orig)) -- no +1 on the position (llama4 has one)
        return TemperatureSpec(float(rp["original_max_position_embeddings"]), float(beta), offset=0)

    def layer_config(self, config, i: int):
        return super().layer_config(config, i).replace(temperature=self._temperature(config))

    def lc_points_for(self, config, i: int):
        pts = dict(super().lc_points_for(config, i))
        if (config.rope_parameters or {}).get("llama_4_scaling_beta"):
            # the file's attention.temperature_scale is set: mistral3.cpp: cb(Qcur, "Qcur_attn_temp_scaled", il) after ggml_mul by inp_attn_scale
            pts["q_rope"] = type(pts["q_rope"])("Qcur_attn_temp_scaled", "last", "heads")
        return pts

    def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
        sw = super().feature_switches(config, features)
        if "temperature_no_offset" in features:
            rp = dict(config.rope_parameters)
            rp["llama_4_scaling_beta"] = 0.0  # HF: scale 1 everywhere; the converter writes 0 = off
            sw["temperature_no_offset"] = {"rope_parameters": rp}
        rp = config.rope_parameters or {}
        for tag in [t for t, o in sw.items() if "rope_parameters" in o and t != "temperature_no_offset"]:
            # the RoPE switches (identity RoPE, default RoPE) keep only theta and the rotary width;
            # Ministral3Attention also reads llama_4_scaling_beta and original_max_position_embeddings
            # from rope_parameters (get_llama_4_attn_scale: None / None fails), and the temperature is
            # not RoPE: keep them
            keep = {k: rp[k] for k in ("llama_4_scaling_beta", "original_max_position_embeddings") if k in rp}
            sw[tag] = {**sw[tag], "rope_parameters": {**sw[tag]["rope_parameters"], **keep}}
        return sw

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/mistral3.py Ministral3Model.set_gguf_parameters: LlamaModel's keys,
        # then (model_type ministral3) the YaRN log multiplier and the temperature scale
        super(Mistral3, self).gguf_params(w, config, variant)
        rp = config.rope_parameters
        w.add_rope_scaling_yarn_log_mul(rp["mscale_all_dim"])
        w.add_attn_temperature_scale(rp["llama_4_scaling_beta"])

    def config_from_gguf(self, meta, shapes, tensors):
        """mistral3.cpp load_arch_hparams: the RMS eps, the temperature scale (its floor
        scale is ``n_ctx_orig_yarn``, offset 0), the YaRN betas and log multiplier
        (the attention factor from it with mscale 1, llama-context.cpp)."""

        kw = super(Mistral3, self).config_from_gguf(meta, shapes, tensors)
        hp = read_hparams(meta)
        log_mul = meta.get_f32("rope.scaling.yarn_log_multiplier", 0.0)
        rope = hf_rope(meta, hp, log_mul=log_mul)
        if rope.get("rope_type") != "yarn":
            meta.refuse("rope.scaling.type", rope.get("rope_type"), "Ministral 3 is YaRN (the converter asserts it)")
        beta_fast = meta.get_f32("rope.scaling.yarn_beta_fast", 32.0)
        beta_slow = meta.get_f32("rope.scaling.yarn_beta_slow", 1.0)
        # mscale 1 over mscale_all_dim = log_mul: the ratio llama-context.cpp computes
        rope.update(beta_fast=beta_fast, beta_slow=beta_slow, mscale=1.0, mscale_all_dim=log_mul or 1.0,
                    llama_4_scaling_beta=meta.get_f32("attention.temperature_scale", 0.0))
        rope.pop("attention_factor", None)  # HF derives it from mscale / mscale_all_dim
        kw["rope_parameters"] = rope
        kw["sliding_window"] = None
        return kw


FAMILY = Ministral3()
