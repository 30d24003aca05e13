"""What this reference knows of the families, in one table (the reference owns it,
not the families: issue 38's "the next reference costs one folder").

``UNSUPPORTED``: a family mlx-lm implements by name whose model it cannot build or
run from transformers' checkpoint, each with the measured reason (mlx-lm 0.32.2,
transformers 5.24.0, the family's default case, 2026-12-06): the family is
``not-implemented`` for this reference, its cases run the others. Measured with
``conformance run --family F --ref mlx``; a family leaves the table when that
command builds the model.
"""

# transformers 5's save_pretrained writes some families' weights under names or in layouts
# the hub's checkpoints (which mlx-lm's sanitize() reads) do not use
_LAYOUT = "mlx-lm's sanitize() reads the hub's checkpoint layout, not transformers 5's save_pretrained one"

UNSUPPORTED: dict[str, str] = {
    "gpt2": f"{_LAYOUT}: 'Received 28 parameters not in model: model.transformer.h.0.attn.c_attn.bias ...' "
            "(mlx_lm/models/gpt2.py Model.sanitize)",
    "qwen3_next": f"{_LAYOUT}: the full-attention layers' 'model.layers.1.self_attn.*' are not in its model "
                  "(mlx_lm/models/qwen3_next.py)",
    "bitnet": "mlx_lm/models/bitnet.py reads packed ternary weights with a weight_scale per projection "
              "('Missing 21 parameters: ...weight_scale'); transformers' BitNet checkpoint holds float weights",
    "gpt_bigcode": "mlx_lm/models/gpt_bigcode.py fails building its model on MLX 0.32.4 "
                   "('uniform(): incompatible function arguments' in its initialiser)",
    "gpt_neox": "mlx_lm/models/gpt_neox.py sizes its MLP 4 x hidden_size and ignores intermediate_size "
                "('Expected shape (256, 64) but received shape (96, 64)' for dense_h_to_4h)",
    "granitemoehybrid": "mlx_lm/models/granitemoehybrid.py knows the layer types mamba and attention only "
                        "('Unknown layer type: linear_attention')",
}

# A configuration mlx-lm's module for a model type cannot build, by that model type: a test on
# the config mlx-lm reads (checkpoint.bridged: the hub's keys) and why. Each met by the fuzz.
CONFIG_REFUSALS: dict[str, tuple] = {
    "deepseek_v2": (lambda c: c.get("rope_scaling") is None,
                    "mlx_lm/models/deepseek_v2.py DeepseekV2Attention.__init__ reads rope_scaling['factor'] and "
                    "always builds its YaRN rotation (DeepseekV2YarnRotaryEmbedding); a model without rope scaling "
                    "(rope_type default) fails there: 'NoneType' object has no attribute 'get' (conformance fuzz "
                    "--seed 5, deepseek_v2 absorbed)"),
    "llama4": (lambda c: int((c.get("text_config") or c).get("num_hidden_layers", 4)) < 4,
               "mlx_lm/models/llama4.py LlamaModel.__call__ takes the global mask from cache[3] and makes every "
               "4th layer global ((idx + 1) % 4); a model of fewer than 4 layers fails there: IndexError "
               "(scripts/key_sweep.py --layers 1)"),
}

# Probes a family's ``hf_canonical`` completes with the product HF's next line makes (no HF
# module returns it), where mlx-lm's module output already is its own value -- a multiplier
# its sanitize() folded into the weight, or one it never applies. Completing those would
# count a multiplier twice, or credit mlx-lm with one it lacks. Each measured with
# ``conformance run --family F --ref mlx`` against its --set variations (mlx-lm 0.32.2).
OWN_VALUE: dict[str, dict[str, str]] = {
    "falcon_h1": {
        "attn_out": "mlx_lm/models/falcon_h1.py Model.sanitize folds attention_out_multiplier into o_proj.weight",
        "ssm_out": "mlx_lm/models/falcon_h1.py Model.sanitize folds ssm_out_multiplier into mamba.out_proj.weight",
        "k": "mlx-lm never applies key_multiplier: Model.sanitize folds it into a 'key_proj.weight' transformers' "
             "checkpoint does not hold, and FalconH1Attention.__call__ does not multiply (mlx_lm/models/falcon_h1.py)",
    },
}

# mlx-lm modules that keep the hub checkpoint's names where transformers renames them on load:
# HF's point path -> mlx-lm's, by prefix (the longest first). mlx_lm/models/exaone.py is EXAONE 3's
# remote code (transformer.h.N.attn.attention.q_proj, ln_1, ln_2, mlp.c_fc_0, wte, ln_f), which
# transformers 5 maps onto llama's names (conversion_mapping.py "exaone") and saves back
PATHS: dict[str, dict[str, str]] = {
    "exaone": {
        "model.embed_tokens": "transformer.wte", "model.norm": "transformer.ln_f", "model.layers": "transformer.h",
        "self_attn.o_proj": "attn.attention.out_proj", "self_attn": "attn.attention",
        "input_layernorm": "ln_1", "post_attention_layernorm": "ln_2",
        "mlp.gate_proj": "mlp.c_fc_0", "mlp.up_proj": "mlp.c_fc_1", "mlp.down_proj": "mlp.c_proj",
    },
    # the checkpoint is rewritten as the hub's Llama4ForConditionalGeneration (checkpoint.LAYOUTS):
    # the text model sits under language_model (mlx_lm/models/llama4.py Model.language_model)
    "llama4": {"model": "language_model.model", "lm_head": "language_model.lm_head"},
}


def mlx_path(family: str, path: str) -> str:
    """HF's module path ``path`` in mlx-lm's model of ``family`` (PATHS; the same path elsewhere)."""
    for hf, mlx in sorted(PATHS.get(family, {}).items(), key=lambda kv: -len(kv[0])):
        if path == hf or path.startswith(hf + "."):
            return mlx + path[len(hf):]
    return path

# MLA families whose mlx-lm module runs the NAIVE form through base.scaled_dot_product_attention:
# its queries / keys / output there are HF eager's query_states / key_states / attn_output (per head,
# nope | rope), so the SDPA wrapper reads q_rope, k_rope and attn_heads of them (and HF's views
# q_pe / k_pe follow, _mla.hf_derived). Not deepseek_v2/v3: their mlx-lm modules absorb kv_b into
# the query, and the arrays handed to the SDPA are latent-space
SDPA_MLA = {"minicpm3": "mlx_lm/models/minicpm3.py Attention.__call__: concat(q_nope, q_pe), "
                        "concat(k_nope, broadcast k_pe), values from kv_b_proj"}
