"""Feature bisection's switches: config overrides, case fields and edits of the
seeded model that turn ONE feature off for the reference (and impl, which
derives its layers from the same config) -- ``harness/bisect.py`` drives them."""

from __future__ import annotations

from ..config_values import global_value
from ..kinds.switches import ModelSwitch  # noqa: F401 (re-exported)
from .. import kinds

# HF FalconH1Config's scalar multipliers of the two parallel branches (the feature
# ``branch_multipliers``: LayerConfig attn_in / key / attn_out / ssm_in / ssm_out_multiplier)
BRANCH_MULTIPLIERS = ("attention_in_multiplier", "key_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
                      "ssm_out_multiplier")


class Switches:
    """The bisection half of ``Family`` (mixed in)."""
    def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
        """Config overrides that switch one feature OFF in the reference -- and so
        in impl, which derives its layers from the same config. Used by feature
        bisection; a family extends this (calling super) for what only it knows.
        Only settings HF itself honours belong here."""
        sw: dict[str, dict] = {}
        keys = set(self.settable_keys())
        types = list(getattr(config, "layer_types", None) or [])
        if "sliding_window" in features and types and "layer_types" in keys:
            o = {"layer_types": ["full_attention" if t == "sliding_attention" else t for t in types]}
            if "use_sliding_window" in keys:
                o["use_sliding_window"] = False
            sw["sliding_window"] = o
        if "qkv_bias" in features and "attention_bias" in keys:
            sw["qkv_bias"] = {"attention_bias": False}
        rp = dict(config.rope_parameters or {}) if "rope_parameters" in keys else {}
        if "rope_scaling" in features and rp.get("rope_type", "default") != "default" and "rope_theta" in rp:
            sw["rope_scaling"] = {"rope_parameters": {"rope_type": "default", "rope_theta": rp["rope_theta"]}}
        if "softcap" in features and "attn_logit_softcapping" in keys:
            sw["softcap"] = {"attn_logit_softcapping": None}
        # every query head its own KV head: HF sizes k_proj / v_proj from num_key_value_heads
        nh = getattr(config, "num_attention_heads", None)
        nkv = global_value(config, "num_key_value_heads")  # None per layer (gemma4's global KV heads)
        # a head count per layer (laguna's num_attention_heads_per_layer [4, 8, 8, 8]) leaves
        # grouped layers at any one KV count: no single setting switches GQA off
        per_layer = set(getattr(config, "num_attention_heads_per_layer", None) or ())
        if {"gqa", "mqa"} & features and "num_key_value_heads" in keys and nh and nkv and nkv < nh \
                and len(per_layer) <= 1:
            for tag in {"gqa", "mqa"} & features:
                sw[tag] = {"num_key_value_heads": nh}
        # RoPE neutralised: linear scaling by a factor so large that every inv_freq is
        # ~0 and the rotation is the identity (modeling_rope_utils
        # _compute_linear_scaling_rope_parameters: inv_freq /= factor; llama.cpp:
        # freq_scale = 1 / factor). The RoPE code still runs; it turns nothing.
        ident = rope_identity_overrides(config) if "rope_parameters" in keys else None
        if ident is not None:
            for tag in {"rope_neox", "rope_interleaved"} & features:
                sw[tag] = ident
        if "partial_rotary" in features and rp:
            # every channel of the head rotates: partial_rotary_factor 1 where the config
            # keeps it (rope_parameters, per layer type or flat)
            if all(isinstance(v, dict) for v in rp.values()):
                if any("partial_rotary_factor" in v for v in rp.values()):
                    sw["partial_rotary"] = {"rope_parameters": {
                        t: {**v, "partial_rotary_factor": 1.0} if "partial_rotary_factor" in v else v
                        for t, v in rp.items()}}
            elif "partial_rotary_factor" in rp:
                sw["partial_rotary"] = {"rope_parameters": {**rp, "partial_rotary_factor": 1.0}}
        if "partial_rotary" in features and "partial_rotary" not in sw and "partial_rotary_factor" in keys:
            sw["partial_rotary"] = {"partial_rotary_factor": 1.0}
        if "rope_proportional" in features and rp and all(isinstance(v, dict) for v in rp.values()):
            # proportional RoPE (gemma4's global layers) as the default kind over the same head:
            # every pair turns at base^(-2i/head_dim) -- the still pairs are what goes away
            sw["rope_proportional"] = {"rope_parameters": {
                t: {"rope_type": "default", "rope_theta": v["rope_theta"]} if v.get("rope_type") == "proportional"
                else v for t, v in rp.items()}}
        if "longrope" in features and rp.get("rope_type") == "longrope" and rp.get("long_factor"):
            # LongRoPE's factor sets all ones: the bands are theta's own (HF
            # _compute_longrope_parameters divides by them; the converter writes them as
            # rope_factors_long / _short, which ggml_rope_ext divides by)
            n = len(rp["long_factor"])
            sw["longrope"] = {"rope_parameters": {**rp, "short_factor": [1.0] * n, "long_factor": [1.0] * n}}
        # the parallel branches' muP multipliers at 1 (falcon_h1): HF applies each at run time
        # (FalconH1DecoderLayer.forward attention_in / attn_out / ssm_out, FalconH1Attention
        # key_multiplier, FalconH1Mixer ssm_in_multiplier and mup_vector), impl reads them from
        # the same config, and the converter folds a 1 into nothing
        mults = [k for k in BRANCH_MULTIPLIERS if k in keys and getattr(config, k, 1.0) != 1.0]
        if "branch_multipliers" in features and mults:
            sw["branch_multipliers"] = {k: 1.0 for k in mults}
        mup = getattr(config, "ssm_multipliers", None)
        if "mup_vector" in features and "ssm_multipliers" in keys and mup:
            sw["mup_vector"] = {"ssm_multipliers": [1.0] * len(mup)}
        if "rope_attn_factor" in features and rp.get("rope_type") == "yarn":
            # _compute_yarn_parameters takes an explicit attention_factor as given
            sw["rope_attn_factor"] = {"rope_parameters": {**rp, "attention_factor": 1.0}}
        return sw

    def case_switches(self, case, features: set[str]) -> dict[str, dict]:
        """Case fields that switch a feature off for every side at once (the KV
        backing; a family's named variant). Used by feature bisection."""
        sw: dict[str, dict] = {}
        if "kv_paged" in features:  # the same rows through a block table, or contiguous
            sw["kv_paged"] = {"kv": "batched"}
        if "kv_evict" in features:  # every row kept (the spec's default)
            sw["kv_evict"] = {"evict": False}
        if "kv_ragged" in features:  # the sequences in lockstep: one length, one chunk plan, all from call 0
            sw["kv_ragged"] = {"ragged": False}
        return sw

    # HF module paths (relative to a decoder layer) of the norms a module switch
    # replaces by the identity; a family whose modules are named otherwise overrides.
    switch_modules: dict[str, tuple[str, ...]] = {
        "input_norm": ("input_layernorm",),
        "qk_norm": ("self_attn.q_norm", "self_attn.k_norm"),
        "v_norm": ("self_attn.v_norm",),
        "post_norm": ("post_attention_layernorm",),
        "sub_norm": ("self_attn.attn_sub_norm",),
        "output_gate": ("self_attn.gate_proj",),
    }
    # HF parameter name endings (within a decoder layer) a weight switch neutralises
    switch_params: dict[str, tuple[str, ...]] = {
        "qkv_bias": ("q_proj.bias", "k_proj.bias", "v_proj.bias", "query_key_value.bias", "qkv_proj.bias",
                     "Wqkv.bias", "c_attn.bias"),
        "o_bias": ("o_proj.bias", "self_attention.dense.bias", "attn.out_proj.bias"),
        "sinks": ("self_attn.sinks",),
        "qk_norm_bias": ("q_layernorm.bias", "k_layernorm.bias", "q_norm.bias", "k_norm.bias"),
    }

    def model_switches(self, config) -> dict[str, "ModelSwitch"]:
        """Features switched off (or neutralised) in the seeded model itself, where
        no config field reaches: ``Case.switch_off`` names them, the case's Build
        applies them to the model every side takes its weights from (and, for a module
        switch, to impl's layer configs). Each layer kind owns its switches
        (``LayerKind.switches``, harness/kinds/<kind>/switches.py); a family adds what
        only it has by extending this."""

        sw: dict = {}
        for kind in kinds.registry().values():
            sw.update(kind.switches(self))
        return sw


def rope_identity_overrides(config) -> dict | None:
    """Config overrides that make RoPE the identity (linear scaling, factor 1e30),
    keeping theta and the rotary width; per layer type where the family keys
    ``rope_parameters`` so. None if the config has no RoPE parameters."""
    rp = dict(getattr(config, "rope_parameters", None) or {})
    keep = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")

    def ident(p):
        # proportional (gemma4's global layers) keeps its kind: its table spans the whole head
        # and divides by the same `factor` (HF _compute_proportional_rope_parameters)
        kind = "proportional" if p.get("rope_type") == "proportional" else "linear"
        return {"rope_type": kind, "factor": 1e30, **{k: p[k] for k in keep if k in p}}

    if "rope_theta" in rp:
        return {"rope_parameters": ident(rp)}
    if rp and all(isinstance(v, dict) and "rope_theta" in v for v in rp.values()):
        return {"rope_parameters": {t: ident(p) for t, p in rp.items()}}
    return None
