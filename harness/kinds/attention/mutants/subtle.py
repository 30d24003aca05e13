"""Mutants that are wrong by a LITTLE (issue 14): a parameter perturbed by a
percent, an epsilon ten times too large, a YaRN beta off by one, one rotated
pair short. Gross breaks (harness/kinds/attention/mutants/core.py ...) fail any tolerance; these
show whether the tolerances are tight enough to notice an engine that is almost
right -- the bugs that survive a casual comparison.

Most are parametric: ``new`` holds ``{d}``, the relative perturbation of the
parameter, and ``param`` its default size. ``conformance mutate --sensitivity``
searches, per decoration and per dtype, the smallest ``d`` the matrix still
catches (README "Mutation self-test"). ``dtypes`` names the precisions whose
rounding leaves the default perturbation visible: a 1% error is below the
rounding of bfloat16 (8 bits of mantissa), where the sensitivity table gives
what bfloat16 does see; the mutation score per dtype counts a mutant only
where it is visible.
"""

from ...mutant import Mutant
from .features3_alibi_chunk import ALIBI_NOTE

EXACT = ("float64", "float32")
GEMMA2_SOFTCAP = {"family": "gemma2", "dtype": "float64"}
YARN = {"family": "gpt_oss", "dtype": "float64", "overrides": (("rope_parameters.truncate", False),)}

MUTANTS = [
    Mutant("norm-eps-tenfold", "gqa", "impl.norms",
           "y = xf / xp.sqrt(var + spec.eps)", "y = xf / xp.sqrt(var + spec.eps * (1 + {d}))",
           {"family": "llama", "dtype": "float64"}, "attn_in", core=True, subtle=True, param=9.0, dtypes=EXACT,
           doc="every norm's epsilon ten times too large (1e-5 for 1e-6): NMSE ~1e-11 at attn_in, "
               "inside the old float32 bound",
           bisect_note="the epsilon of every norm (input, QK, post) is in every layer; no feature tag names it"),
    Mutant("rope-theta-1pct", "rope_neox", "impl.rope",
           "base_inv = 1.0 / (float(theta) ** exponents)", "base_inv = 1.0 / ((float(theta) * (1 + {d})) ** exponents)",
           {"family": "llama", "dtype": "float64"}, "q_rope", subtle=True, param=0.01, dtypes=EXACT,
           doc="the RoPE base 1% off (10100 for 10000): every pair but the first rotates at a slightly wrong rate"),
    Mutant("softmax-scale-1pct", "gqa", "impl.attention",
           "scores = xp.astype(xp.matmul(qh, kh), acc, copy=False) * scale",
           "scores = xp.astype(xp.matmul(qh, kh), acc, copy=False) * (scale * (1 + {d}))",
           {"family": "llama", "dtype": "float64"}, "attn_probs", core=True, subtle=True, param=0.01, dtypes=EXACT,
           doc="the softmax scale 1% off: a slightly sharper softmax",
           bisect_note="the softmax scale is applied in every attention; no feature tag names the default scale"),
    Mutant("softcap-1pct", "softcap", "impl.attention",
           "scores = softcap * xp.tanh(scores / softcap)",
           "scores = (softcap * (1 + {d})) * xp.tanh(scores / (softcap * (1 + {d})))",
           GEMMA2_SOFTCAP, "attn_probs", subtle=True, param=0.01, dtypes=EXACT,
           doc="the logit softcap 1% off (50.5 for 50)"),
    Mutant("yarn-beta-fast-plus-one", "rope_scaling", "impl.rope",
           'beta_fast = p.get("beta_fast") or 32.0', 'beta_fast = (p.get("beta_fast") or 32.0) * (1 + {d})',
           YARN, "q_rope", subtle=True, param=1 / 32, dtypes=EXACT,
           doc="YaRN's beta_fast off by one (33 for 32): the ramp between extrapolated and interpolated bands moves "
               "(visible where the correction range is not floored, rope_parameters.truncate = false)"),
    Mutant("alibi-max-bias-7", "alibi", "impl.config",
           "n_log2 = 2 ** math.floor(math.log2(n_heads))",
           "n_log2 = 2 ** math.floor(math.log2(n_heads)); max_bias = max_bias * (1 + {d})",
           {"family": "bloom", "dtype": "float64"}, "attn_probs", subtle=True, param=-0.125, dtypes=EXACT,
           doc="ALiBi's max bias 7 for 8: every head's slope slightly off", bisect_note=ALIBI_NOTE),
    Mutant("sink-logits-1pct", "sinks", "impl.attention",
           "s = xp.reshape(xp.astype(sinks, acc), (q.shape[1], 1, 1))",
           "s = xp.reshape(xp.astype(sinks, acc), (q.shape[1], 1, 1)) * (1 + {d})",
           {"family": "gpt_oss", "dtype": "float64"}, "attn_probs", subtle=True, param=0.01, dtypes=EXACT,
           doc="the learned sink logits scaled by 1.01"),
    Mutant("value-scale-1pct", "value_scale", "impl.attention",
           "out = out * cfg.value_scale", "out = out * (cfg.value_scale * (1 + {d}))",
           {"family": "mimo_v2_flash", "dtype": "float64"}, "attn_out", subtle=True, param=0.01, dtypes=EXACT,
           doc="the value scale after wo 1% off"),
    Mutant("o-scale-1pct", "o_scale", "impl.attention",
           "out = out * cfg.o_scale", "out = out * (cfg.o_scale * (1 + {d}))",
           {"family": "llama", "variant": "wo_scale", "dtype": "float64"}, "attn_out", subtle=True, param=0.01,
           dtypes=EXACT, doc="the wo scale companion 1% off"),
    Mutant("rope-attn-factor-1pct", "rope_attn_factor", "impl.rope",
           "return np.cos(ang) * spec.attention_factor, np.sin(ang) * spec.attention_factor",
           "return np.cos(ang) * (spec.attention_factor * (1 + {d})), np.sin(ang) * (spec.attention_factor * (1 + {d}))",
           {"family": "gpt_oss", "dtype": "float64"}, "q_rope", subtle=True, param=0.01, dtypes=EXACT,
           doc="YaRN's attention factor (mscale on cos and sin) 1% off",
           bisect_note="it scales the factor multiplicatively: the feature switch sets the attention factor "
                       "to 1, and 1.01 x 1 still differs, so no switch turns this break off"),
    Mutant("temperature-1pct", "temperature", "impl.attention",
           "scales = np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * t.attn_scale + 1.0",
           "scales = np.log1p(np.floor((pos + t.offset) / t.floor_scale)) * (t.attn_scale * (1 + {d})) + 1.0",
           {"family": "llama4", "dtype": "float64", "overrides": (("floor_scale", 2), ("attn_scale", 0.5))},
           "q_rope", layer=3, subtle=True, param=0.01, dtypes=EXACT,
           doc="llama4's attention temperature scale 1% off"),
    Mutant("residual-multiplier-1pct", "residual_multiplier", "impl.attention",
           "resid = x + branch * cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else x + branch",
           "resid = x + branch * (cfg.residual_multiplier * (1 + {d})) if cfg.residual_multiplier != 1.0 else x + branch",
           {"family": "granite", "dtype": "float64"}, "resid_mid", subtle=True, param=0.01, dtypes=EXACT,
           doc="granite's residual multiplier 1% off"),
    Mutant("partial-rotary-one-pair-short", "partial_rotary", "impl.rope",
           "    half = rotary_dim // 2\n",
           "    if rotary_dim < x.shape[-1]:\n"
           "        rotary_dim -= 2\n"
           "        cos, sin = cos[..., : rotary_dim // 2], sin[..., : rotary_dim // 2]\n"
           "    half = rotary_dim // 2\n",
           {"family": "qwen3_next", "dtype": "float64"}, "q_rope", subtle=True,
           doc="a partially rotated head rotates one pair fewer than its rotary width: the last rotated pair "
               "passes through"),
]
