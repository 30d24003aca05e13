"""Feature bisection's switches: config overrides, case fields and edits of the
seeded model that turn ONE feature off for the reference (and impl, which
derives its layers from the same config) -- ``harness/bisect.py`` drives them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from impl import LayerConfig, NormSpec


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
        nh, nkv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
        if {"gqa", "mqa"} & features and "num_key_value_heads" in keys and nh and nkv and nkv < nh:
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
        return sw

    # HF module paths (relative to a decoder layer) of the norms a module switch
    # replaces by the identity; a family whose modules are named otherwise overrides.
    switch_modules: dict[str, tuple[str, ...]] = {
        "input_norm": ("input_layernorm",),
        "qk_norm": ("self_attn.q_norm", "self_attn.k_norm"),
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
    }

    def model_switches(self, config) -> dict[str, "ModelSwitch"]:
        """Features switched off (or neutralised) in the seeded model itself, where
        no config field reaches: ``Case.switch_off`` names them, ``CaseRun`` applies
        them to the model every side takes its weights from (and, for a module
        switch, to impl's layer configs). A weight switch holds for both
        references (the GGUF is exported from the switched model); a module switch
        replaces an HF module by the identity, which only the HF reference sees."""
        def weight_switch(what, tag, value):
            return ModelSwitch(what, lambda m, c, lcs: _fill_params(self, m, self.switch_params[tag], value))

        sw = {
            "qkv_bias": weight_switch("Q/K/V projection biases zeroed", "qkv_bias", 0.0),
            "o_bias": weight_switch("o_proj bias zeroed", "o_bias", 0.0),
            # -1e4 (finite in f16): exp(sink - max) underflows to 0 in every precision compared
            "sinks": weight_switch("sink logits at -1e4: they take no probability mass", "sinks", -1e4),
        }

        def module_switch(what, slots, drop, swap=None):
            def paths(lc):
                return [p for slot in slots(lc) for p in self.switch_modules.get(slot, ())]

            def edit(m, c, lcs):
                return _identity_modules(self, m, lcs, paths, swap)

            def layer(lc):
                return drop(lc) if isinstance(lc, LayerConfig) else lc

            return ModelSwitch(what, edit, layer, hf_only=True)

        def has(lc, slot):
            if not isinstance(lc, LayerConfig):
                return False
            if slot == "input_norm":
                return lc.input_norm.kind != "none"
            return getattr(lc, slot) is not None

        def none_input(lc):
            return lc.replace(input_norm=NormSpec("none", lc.input_norm.eps))

        sw["post_norm"] = module_switch("post-attention norm removed (HF module -> identity; impl post_norm None)",
                                        lambda lc: ["post_norm"] if has(lc, "post_norm") else [],
                                        lambda lc: lc.replace(post_norm=None))
        sw["sub_norm"] = module_switch("attention sub-norm removed (HF module -> identity; impl sub_norm None)",
                                       lambda lc: ["sub_norm"] if has(lc, "sub_norm") else [],
                                       lambda lc: lc.replace(sub_norm=None))
        for tag, over in (("qk_norm_head", "head"), ("qk_norm_row", "row")):
            def pre(lc, over=over):
                return has(lc, "qk_norm") and lc.qk_norm.where == "pre_rope" and lc.qk_norm.over == over

            sw[tag] = module_switch(f"{tag} removed (HF q_norm / k_norm -> identity; impl qk_norm None)",
                                    lambda lc, pre=pre: ["qk_norm"] if pre(lc) else [],
                                    lambda lc, pre=pre: lc.replace(qk_norm=None) if pre(lc) else lc)

        def is_layer(lc):
            return has(lc, "input_norm") and lc.input_norm.kind == "layer"

        sw["layernorm"] = module_switch("input LayerNorm removed (HF module -> identity; impl input norm none)",
                                        lambda lc: ["input_norm"] if is_layer(lc) else [],
                                        lambda lc: none_input(lc) if is_layer(lc) else lc)

        def rms1p_slots(lc):
            if not isinstance(lc, LayerConfig):
                return []
            out = ["input_norm"] if lc.input_norm.kind == "rms1p" else []
            out += ["qk_norm"] if lc.qk_norm is not None and lc.qk_norm.norm.kind == "rms1p" else []
            return out + (["post_norm"] if lc.post_norm is not None and lc.post_norm.kind == "rms1p" else [])

        def rms1p_plain(lc):
            # the same norms in the plain convention: x / rms(x) * w' with w' = 1 + w
            kw = {}
            slots = rms1p_slots(lc)
            if "input_norm" in slots:
                kw["input_norm"] = dataclasses.replace(lc.input_norm, kind="rms")
            if "qk_norm" in slots:
                kw["qk_norm"] = dataclasses.replace(lc.qk_norm, norm=dataclasses.replace(lc.qk_norm.norm, kind="rms"))
            if "post_norm" in slots:
                kw["post_norm"] = dataclasses.replace(lc.post_norm, kind="rms")
            return lc.replace(**kw) if kw else lc

        sw["rms1p"] = module_switch("every (1 + w) norm turned into a plain RMS norm with weight 1 + w "
                                    "(HF module -> LlamaRMSNorm; impl kind rms)", rms1p_slots, rms1p_plain,
                                    swap=_plain_rms)

        def separate_gate(lc):
            return isinstance(lc, LayerConfig) and lc.output_gate

        sw["output_gate"] = module_switch("the output gate held open (HF gate projection -> a constant 1e4, "
                                          "sigmoid = 1; impl output_gate off)",
                                          lambda lc: ["output_gate"] if separate_gate(lc) else [],
                                          lambda lc: lc.replace(output_gate=False) if separate_gate(lc) else lc,
                                          swap=_open_gate)
        return sw


@dataclass(frozen=True)
class ModelSwitch:
    """One feature switched off in the seeded model (see ``Family.model_switches``).

    ``edit(model, config, layer_cfgs)`` changes the model in place and returns how
    many tensors or modules it changed (0: the feature is not there to switch);
    ``layer(lc)`` tells impl the same (a module switch), None for a weight switch,
    which neutralises weights impl reads from the model anyway."""

    what: str
    edit: Any
    layer: Any = None
    hf_only: bool = False


def _fill_params(family, model, endings: tuple[str, ...], value: float) -> int:
    import torch

    n = 0
    with torch.no_grad():
        for layer in family.decoder_layers(model):
            for name, p in layer.named_parameters():
                if name.endswith(endings):
                    p.fill_(value)
                    n += 1
    return n


def _plain_rms(module):
    """A ``(1 + w)`` RMS norm module as HF ``LlamaRMSNorm`` with weight ``1 + w``."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    w = module.weight.detach()
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", 1e-6))
    new = LlamaRMSNorm(w.shape[-1], eps=eps).to(w.dtype)
    with torch.no_grad():
        new.weight.copy_(1.0 + w)
    return new


def _open_gate(module):
    """A gate projection replaced by a constant 1e4: ``sigmoid(1e4) == 1`` exactly in
    every float type, so the gate it feeds passes the branch through unchanged."""
    import torch

    class OpenGate(torch.nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.width = width

        def forward(self, x):
            return torch.full((*x.shape[:-1], self.width), 1e4, dtype=x.dtype, device=x.device)

    return OpenGate(module.out_features)


def _identity_modules(family, model, layer_cfgs, paths_of, swap=None) -> int:
    """Replace the modules at ``paths_of(layer_cfg)`` in every decoder layer by the
    identity (or by ``swap(module)``); the number replaced."""
    import torch

    n = 0
    for i, layer in enumerate(family.decoder_layers(model)):
        if i >= len(layer_cfgs):
            break
        for path in paths_of(layer_cfgs[i]):
            parent, _, leaf = path.rpartition(".")
            try:
                owner = layer.get_submodule(parent) if parent else layer
            except AttributeError:
                continue
            mod = getattr(owner, leaf, None)
            # a module another switch of the same case already removed stays removed
            if isinstance(mod, torch.nn.Module) and not isinstance(mod, torch.nn.Identity):
                setattr(owner, leaf, torch.nn.Identity() if swap is None else swap(mod))
                n += 1
    return n


def rope_identity_overrides(config) -> dict | None:
    """Config overrides that make RoPE the identity (linear scaling, factor 1e30),
    keeping theta and the rotary width; per layer type where the family keys
    ``rope_parameters`` so. None if the config has no RoPE parameters."""
    rp = dict(getattr(config, "rope_parameters", None) or {})
    keep = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")

    def ident(p):
        return {"rope_type": "linear", "factor": 1e30, **{k: p[k] for k in keep if k in p}}

    if "rope_theta" in rp:
        return {"rope_parameters": ident(rp)}
    if rp and all(isinstance(v, dict) and "rope_theta" in v for v in rp.values()):
        return {"rope_parameters": {t: ident(p) for t, p in rp.items()}}
    return None
