"""Mutants of multi-head latent attention (impl.mla): each breaks one MLA
decoration the way an engine plausibly would, on a case that exercises it,
and names the probe where it first shows."""

from ..mutant import Mutant

DSV2 = {"family": "deepseek_v2"}  # absorbed (the family's default variant), YaRN mscale 0.707
DSV2_NAIVE = {"family": "deepseek_v2", "variant": "naive"}
# glm-dsa YaRN with mscale_all_dim only: rope magnitude L(1) = 1.139 on the rotated
# channels (the one YaRN setting HF and llama.cpp's glm-dsa agree on)
GLM_YARN = {"family": "glm_moe_dsa", "overrides": (
    ("rope_parameters.rope_type", "yarn"), ("rope_parameters.factor", 4.0),
    ("rope_parameters.original_max_position_embeddings", 128), ("rope_parameters.mscale_all_dim", 1.0))}

MINICPM3 = {"family": "minicpm3"}  # rotate-half LongRoPE slices, muP residual scale 1.4 / sqrt(2)
# a residual scale far from 1 (4 / sqrt(2) = 2.83): at the tiny config's 1.4 / sqrt(2) = 0.990
# dropping it is a 1% change, inside bfloat16's rounding (it survived the torch-bfloat16
# slice); llama.cpp hard-codes 1.4 (a finding), so against HF alone
MINICPM3_DEPTH = {"family": "minicpm3", "ref": "hf", "overrides": (("scale_depth", 4.0),)}

# Mistral Small 4's query temperature, stepping inside a 16-token case (original context 8;
# the tiny config's 128 is inert there); llama.cpp's mistral4 file names no temperature (a
# finding), so against HF
MISTRAL4_TEMP = {"family": "mistral4", "ref": "hf",
                 "overrides": (("rope_parameters.original_max_position_embeddings", 8),)}

MUTANTS = [
    Mutant("mla-temperature-on-the-rope-slice-only", "mla_temperature", "impl.mla",
           "q_nope, q_pe = temper(be, cfg.temperature, pos, q_nope), temper(be, cfg.temperature, pos, q_pe)",
           "q_pe = temper(be, cfg.temperature, pos, q_pe)",
           MISTRAL4_TEMP, "q_rope",
           doc="Mistral 4's query temperature applied to the decoupled rope slice only, not the whole query "
               "(HF Mistral4Attention.forward scales query_states = cat(q_pass, q_rot); llama.cpp deepseek2.cpp "
               "the whole absorbed Qcur)"),

    Mutant("mla-residual-multiplier-dropped", "mla_residual_multiplier", "impl.mla",
           "resid = x + out * cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else x + out",
           "resid = x + out", MINICPM3_DEPTH, "resid_mid",
           doc="MiniCPM3's branch is added to the residual unscaled (scale_depth / sqrt(L) dropped)"),
    Mutant("mla-rope-neox-as-pairs", "mla_rope", "impl.mla",
           "    d = rope.rotary_dim\n",
           "    d = rope.rotary_dim\n    rope = replace(rope, layout=\"interleaved\")\n",
           MINICPM3, "q_pe", doc="MiniCPM3's decoupled slices rotated in interleaved pairs instead of rotate-half"),
    Mutant("mla-longrope-factors-dropped", "mla_longrope", "impl.mla",
           "    d = rope.rotary_dim\n",
           "    d = rope.rotary_dim\n    cos, sin = ropemod.cos_sin_on(be, replace(rope, freq_factors=None), pos)\n",
           MINICPM3, "q_pe", doc="the LongRoPE factor set is not divided into the decoupled slices' bands"),
    Mutant("mla-kq-scale-absorbed-width", "mla", "impl.mla",
           "return mscale**2 / math.sqrt(cfg.qk_head_dim)",
           "return mscale**2 / math.sqrt(cfg.latent_width)",
           DSV2, "attn_probs",
           doc="the absorbed form scales by its own dot-product width (kv_lora_rank + rope) instead of the "
               "unabsorbed head width (nope + rope) llama.cpp's kq_scale and HF's scaling use",
           bisect_note="kq_scale is shared by both forms, so the mutant acts on the naive form too (tagged mla, "
                       "not mla_absorbed): switching the form does not fix it; mla is listed as unswitchable"),
    Mutant("mla-kq-scale-without-mscale", "mla_yarn", "impl.mla",
           "return mscale**2 / math.sqrt(cfg.qk_head_dim)",
           "return 1.0 / math.sqrt(cfg.qk_head_dim)",
           DSV2, "attn_probs", doc="YaRN's mscale(mscale_all_dim)^2 is not folded into the softmax scale"),
    Mutant("mla-k-rot-chunk-position", "mla_rope", "impl.mla",
           "k_pe = ropemod.rotate(xp, k_pe[:, None, :], cos, sin, rope.layout, d)[:, 0, :]",
           "k_pe = ropemod.rotate(xp, k_pe[:, None, :], *(be.asarray(t) for t in ropemod.cos_sin("
           "replace(rope, attention_factor=1.0), pos - pos[0])), rope.layout, d)[:, 0, :]",
           {**DSV2, "schedule": "mixed"}, "k_pe",
           doc="the shared k_rot is rotated at its position within the call, not its absolute one: right "
               "for the prefill chunk, wrong for every decode row"),
    Mutant("mla-k-rot-per-head-position", "mla_rope", "impl.mla",
           "k = xp.concat([k_nope, xp.broadcast_to(k_pe[:, None, :], (n, h, k_pe.shape[-1]))], axis=-1)",
           "k = xp.concat([k_nope, xp.concat([ropemod.rotate(xp, k_pe[:, None, :], *(be.asarray(t) for t in "
           "ropemod.cos_sin(cfg.rope, np.full(n, j))), cfg.rope.layout, cfg.rope.rotary_dim) for j in range(h)], "
           "axis=1)], axis=-1)",
           DSV2_NAIVE, "k_rope",
           doc="the shared k_rot is rotated again per head as it is copied into the per-head K, head h by h "
               "positions: head 0 stays right, every other head's key is at the wrong position"),
    Mutant("mla-rope-rotate-half", "mla_rope", "impl.mla",
           "    d = rope.rotary_dim\n",
           "    d = rope.rotary_dim\n    rope = replace(rope, layout=\"neox\")\n",
           {"family": "deepseek_v3"}, "q_pe",
           doc="the decoupled slices rotated rotate-half instead of in interleaved pairs"),
    Mutant("mla-yarn-bands-missing", "mla_yarn", "impl.mla",
           "rope = replace(rope, inv_freq=tuple(f / y for f, y in zip(rope.inv_freq, yarn.freq_factors)))",
           "pass",
           DSV2, "q_pe",
           doc="the rotation runs at the plain bands although the file declares YaRN: the magnitude and the "
               "softmax mscale are applied, the per-band divisors forgotten (the half of YaRN a caller that "
               "threads two settings can drop)"),
    Mutant("mla-yarn-magnitude-missing", "mla_yarn", "impl.mla",
           "q_pe, k_pe = q_pe * mag, k_pe * mag", "q_pe, k_pe = q_pe, k_pe",
           GLM_YARN, "q_pe", doc="YaRN's magnitude is not applied to the rotated channels"),
    Mutant("mla-latent-norm-missing", "mla", "impl.mla",
           'c = normalize(xp, ckv[:, :r], cfg.kv_a_norm, w["kv_a_norm"], None, be.acc_dtype)',
           "c = ckv[:, :r]",
           DSV2, "kv_latent", doc="kv_a_layernorm is skipped: the raw latent goes into the cache",
           bisect_note="the latent norm is in every MLA layer (tag mla, which no reference can switch off): "
                       "listed as unswitchable"),
    Mutant("mla-q-latent-norm-weight-dropped", "mla_low_rank_q", "impl.mla",
           'cfg.q_a_norm, w["q_a_norm"], None,', "cfg.q_a_norm, None, None,",
           DSV2, "q_latent", doc="the low-rank Q's RMS norm forgets its weight"),
    Mutant("mla-naive-kv-b-head-minor", "mla_naive", "impl.mla",
           "kvb = xp.reshape(_linear(xp, c, w[\"wkv_b\"], None), (n, h, nope + cfg.v_head_dim))",
           "kvb = xp.permute_dims(xp.reshape(_linear(xp, c, w[\"wkv_b\"], None), (n, nope + cfg.v_head_dim, h)),"
           " (0, 2, 1))",
           DSV2_NAIVE, "k_rope",
           doc="the combined kv_b's rows read channel-major instead of head-major ([nope+v, H] not [H, nope+v])"),
    Mutant("mla-absorbed-v-from-row-tail", "mla_absorbed", "impl.mla",
           "values = l_all[:, None, :r]", "values = l_all[:, None, -r:]",
           DSV2, "attn_heads",
           doc="the absorbed form reads V from the last kv_lora_rank channels of the latent row (taking in "
               "k_pe) instead of the first (llama-graph.cpp build_attn: the offset-0 view)"),
]

# The MLA output gate (spec mla_forward_token `gated`; llama.cpp kimi-k3.cpp) is in no
# family with an HF reference (HF has no Kimi K3; kimi_linear's MLA has no gate), so
# these are not in the registry's reference-checked MUTANTS: tests/test_mla.py checks
# them against a transcription of the spec's gate, at the probe named here.
GATE_MUTANTS = [
    Mutant("mla-gate-dropped", "mla_gate", "impl.mla",
           'branch = branch * _sigmoid(xp, _linear(xp, normed, w["wg"], None))', "branch = branch",
           {}, "attn_branch", doc="use_output_gate is on, and the sigmoid gate is never applied"),
    Mutant("mla-gate-reads-raw-input", "mla_gate", "impl.mla",
           '_sigmoid(xp, _linear(xp, normed, w["wg"], None))', '_sigmoid(xp, _linear(xp, x, w["wg"], None))',
           {}, "attn_branch", doc="the gate is projected from the layer input before its norm"),
]
