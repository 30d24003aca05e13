"""The attention kind's switches of the seeded model: biases zeroed, sinks silenced,
norms and gates replaced by the identity in HF (and switched off in impl's
description), the family's own module and parameter names
(``Family.switch_modules`` / ``switch_params``) saying where they are."""

from __future__ import annotations

import dataclasses

from contract.layers import LayerConfig, NormSpec

from ..switches import ModelSwitch, _fill_params, _identity_modules, _open_gate, _plain_rms


def model_switches(family) -> dict[str, ModelSwitch]:
    """Features switched off (or neutralised) in the seeded model itself, where
    no config field reaches: ``Case.switch_off`` names them, ``CaseRun`` applies
    them to the model every side takes its weights from (and, for a module
    switch, to impl's layer configs). A weight switch holds for both
    references (the GGUF is exported from the switched model); a module switch
    replaces an HF module by the identity, which only the HF reference sees."""
    def weight_switch(what, tag, value):
        return ModelSwitch(what, lambda m, c, lcs: _fill_params(family, m, family.switch_params[tag], value))

    sw = {
        "qkv_bias": weight_switch("Q/K/V projection biases zeroed", "qkv_bias", 0.0),
        "o_bias": weight_switch("o_proj bias zeroed", "o_bias", 0.0),
        # -1e4 (finite in f16): exp(sink - max) underflows to 0 in every precision compared
        "sinks": weight_switch("sink logits at -1e4: they take no probability mass", "sinks", -1e4),
        # a LayerNorm QK norm's bias zeroed (phi q_layernorm.bias): the norm without it
        "qk_norm_bias": weight_switch("QK norm biases zeroed", "qk_norm_bias", 0.0),
        # the parallel SSM branch's out_proj zeroed (falcon_h1 mamba.out_proj): the Mamba-2 block
        # still runs, and adds exactly 0 to the sum (HF FalconH1DecoderLayer.forward
        # `mamba_hidden_states + attention_hidden_states`; falcon-h1.cpp ggml_add(attn_out, ssm_out))
        "parallel_ssm": ModelSwitch("the parallel SSM branch's out_proj zeroed: it adds nothing to the sum",
                                    lambda m, c, lcs: _fill_params(family, m, family.switch_params.get(
                                        "parallel_ssm", ()), 0.0)),
    }

    def module_switch(what, slots, drop, swap=None):
        def paths(lc):
            return [p for slot in slots(lc) for p in family.switch_modules.get(slot, ())]

        def edit(m, c, lcs):
            return _identity_modules(family, m, lcs, paths, swap)

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
    # gemma3n's weightless V norm (HF Gemma3nTextAttention.v_norm; a layer reading another's
    # K / V has no such module, and its own v_norm reads nothing)
    sw["v_norm"] = module_switch("V norm removed (HF v_norm -> identity; impl v_norm None)",
                                 lambda lc: ["v_norm"] if has(lc, "v_norm") else [],
                                 lambda lc: lc.replace(v_norm=None))
    for tag, over in (("qk_norm_head", "head"), ("qk_norm_row", "row")):
        def pre(lc, over=over):
            return has(lc, "qk_norm") and lc.qk_norm.where == "pre_rope" and lc.qk_norm.over == over

        sw[tag] = module_switch(f"{tag} removed (HF q_norm / k_norm -> identity; impl qk_norm None)",
                                lambda lc, pre=pre: ["qk_norm"] if pre(lc) else [],
                                lambda lc, pre=pre: lc.replace(qk_norm=None) if pre(lc) else lc)

    def per_head(lc):
        return has(lc, "qk_norm") and lc.qk_norm.per_head

    # QK norms with a weight per head (stablelm's StableLmLayerNormPerHead, cohere's
    # CohereLayerNorm((heads, head_dim))): the norm removed, as for the shared-weight one
    sw["qk_norm_per_head_weight"] = module_switch(
        "qk_norm_per_head_weight removed (HF per-head q / k norms -> identity; impl qk_norm None)",
        lambda lc: ["qk_norm"] if per_head(lc) else [],
        lambda lc: lc.replace(qk_norm=None) if per_head(lc) else lc)

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
