"""ggml's weight types as the harness names them: which a GGUF may carry and
the ``gguf`` package can dequantize, how coarse each is, which ``llama_ftype``
``--gguf-type`` asks ``llama_model_quantize`` for, and which type ggml's CPU
quantizes the ACTIVATIONS to before it multiplies them by a weight of that type
(``type_traits_cpu[...].vec_dot_type`` in ggml/src/ggml-cpu/ggml-cpu.c).

Names are ggml's, lower case: ``f32``, ``f16``, ``bf16``, ``q8_0``, ``q4_k``,
``iq4_xs`` ... ``gguf`` is imported lazily (an optional dependency).
"""

from __future__ import annotations

from harness.lazy import lazy

gguf = lazy("gguf")

# --gguf-type: the float exports written here, and the llama_ftype values of the
# quantizations llama_model_quantize makes from an F32 export (llama.h enum
# llama_ftype; checked against llama_cpp.LLAMA_FTYPE_MOSTLY_* in tests)
FLOAT_EXPORTS = ("f32", "f16", "bf16")
QUANT_FTYPES = {
    "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9,
    "q2_k": 10, "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15,
    "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18,
    "iq2_xxs": 19, "iq2_xs": 20, "q2_k_s": 21, "iq3_xs": 22, "iq3_xxs": 23, "iq1_s": 24, "iq4_nl": 25,
    "iq3_s": 26, "iq3_m": 27, "iq2_s": 28, "iq2_m": 29, "iq4_xs": 30, "iq1_m": 31, "tq1_0": 36, "tq2_0": 37,
}
GGUF_TYPES = FLOAT_EXPORTS + tuple(QUANT_FTYPES)
# the types llama_model_quantize refuses without an importance matrix ("this
# quantization requires an imatrix!", src/llama-quant.cpp): any tensor but token_embd /
# output.weight headed for IQ1_S / IQ1_M / IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS, or for
# Q2_K in a Q2_K_S file (tensor_requires_imatrix) -- so the ftypes IQ1_S / IQ1_M /
# IQ2_* and IQ3_XXS (their default types), IQ3_XS (attn_q / attn_k and the middle
# layers' ffn_gate / ffn_up go to IQ3_XXS: llama_tensor_get_type) and Q2_K_S. The
# quantized sweep (issue 27) found iq3_xxs, iq3_xs and q2_k_s missing here: they were
# accepted and the llama.cpp capture failed with that message.
NEEDS_IMATRIX = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "iq3_xs", "q2_k_s")
# --gguf-type -> the tensor type llama_model_quantize gives the weights it does not
# special-case (src/llama-quant.cpp llama_ftype_get_default_type): the layers'
# projections, so the activation class (vec_dot_type) impl is judged at against
# llama.cpp. The _S / _M / _L mixes move some tensors (attn_v, ffn_down) to other
# types of the same class; output.weight / token_embd may be another (Q6_K beside
# Q4_0 layers: llama_tensor_get_type), which the file-wide class then reads.
FTYPE_DEFAULT_TYPE = {
    "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1",
    "q2_k": "q2_k", "q2_k_s": "q2_k", "q3_k_s": "q3_k", "q3_k_m": "q3_k", "q3_k_l": "q3_k",
    "q4_k_s": "q4_k", "q4_k_m": "q4_k", "q5_k_s": "q5_k", "q5_k_m": "q5_k", "q6_k": "q6_k",
    "iq2_xxs": "iq2_xxs", "iq2_xs": "iq2_xs", "iq2_s": "iq2_xs", "iq2_m": "iq2_s", "iq3_xxs": "iq3_xxs",
    "iq3_xs": "iq3_s", "iq3_s": "iq3_s", "iq3_m": "iq3_s", "iq1_s": "iq1_s", "iq1_m": "iq1_m",
    "iq4_nl": "iq4_nl", "iq4_xs": "iq4_xs", "tq1_0": "tq1_0", "tq2_0": "tq2_0",
}

# ggml-cpu.c type_traits_cpu[].vec_dot_type: what src1 (the activations) is
# converted to before vec_dot / gemm with a weight of this type
_VEC_DOT = {
    "f32": "f32", "f16": "f16", "bf16": "bf16",
    "q4_0": "q8_0", "q5_0": "q8_0", "q8_0": "q8_0", "iq4_nl": "q8_0", "mxfp4": "q8_0", "nvfp4": "q8_0",
    "q4_1": "q8_1", "q5_1": "q8_1",
    "q2_k": "q8_k", "q3_k": "q8_k", "q4_k": "q8_k", "q5_k": "q8_k", "q6_k": "q8_k",
    "iq2_xxs": "q8_k", "iq2_xs": "q8_k", "iq2_s": "q8_k", "iq3_xxs": "q8_k", "iq3_s": "q8_k",
    "iq1_s": "q8_k", "iq1_m": "q8_k", "iq4_xs": "q8_k", "tq1_0": "q8_k", "tq2_0": "q8_k",
}


def vec_dot_type(weight_type: str) -> str | None:
    """The activation type ggml's CPU multiplies a ``weight_type`` matrix with
    (None: not known here)."""
    return _VEC_DOT.get(weight_type)


def activation_dtype(tensor_types) -> str | None:
    """The coarsest type ggml quantizes activations to for the quantized tensors
    among ``tensor_types`` (``q8_k`` over ``q8_0`` / ``q8_1``: a 256-wide block
    shares one scale, a 32-wide block its own); None if none is quantized."""
    return coarsest_activation(a for a in (vec_dot_type(t) for t in tensor_types if is_quantized(t))
                               if a and a.startswith("q8"))


ACTIVATION_ORDER = ("q8_k", "q8_1", "bf16", "q8_0", "f16")  # coarsest first


def coarsest_activation(acts) -> str | None:
    """The coarsest of activation types: a 256-wide Q8_K block shares one scale,
    a 32-wide Q8_0 / Q8_1 block its own; bf16 keeps 8 significant bits, f16 11."""
    acts = set(acts)
    return next((a for a in ACTIVATION_ORDER if a in acts), None)


def readable() -> set[str]:
    """The tensor types ``--gguf`` reads: F32 / F16 natively, the rest where
    ``gguf.quants.dequantize`` has a dequantizer."""

    return {"f32", "f16"} | {t.name.lower() for t in gguf.quants._type_traits}


def bits_per_weight(weight_type: str) -> float:
    """Storage bits per weight (gguf.GGML_QUANT_SIZES: block bytes * 8 / block size)."""
    if weight_type in ("f32", "float32"):
        return 32.0
    if weight_type in ("f16", "bf16", "float16", "bfloat16"):
        return 16.0

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[weight_type.upper()]]
    return size * 8 / block


def coarsest(types) -> str:
    """The coarsest of the weight types (fewest bits per weight; f32 if none)."""
    types = list(types) or ["f32"]
    return min(types, key=lambda t: (bits_per_weight(t), t))


def is_quantized(weight_type: str) -> bool:
    return weight_type not in ("f32", "f16", "bf16", "float32", "float16", "bfloat16", "float64")
