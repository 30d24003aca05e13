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
    "gpt_oss": f"{_LAYOUT}: the fused experts 'model.layers.0.mlp.experts.down_proj ...' are not in its model "
               "(mlx_lm/models/gpt_oss.py sanitize expects the hub's experts.*_blocks / gate_up_proj)",
    "llama4": f"{_LAYOUT}: 'model.layers.3.feed_forward.experts.gate_up_proj ...' not in its model "
              "(mlx_lm/models/llama4.py sanitize)",
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
