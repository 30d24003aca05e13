"""``llamacpp-fa``, ``llamacpp-fa-kv-f16``, ``llamacpp-fa-kv-q8_0``: llama.cpp
with flash attention on, and with F16 or Q8_0 KV caches, as candidates.

The same GGUF, tokens and decode calls as the llama.cpp reference (the same
capture code, ``harness/references/llamacpp/capture.py``, with the context's
``flash_attn_type`` / ``type_k`` / ``type_v`` changed); llama.cpp cannot be fed
another engine's layer inputs, so the candidate runs free from the tokens like
the references do, and is compared at every probe both sides hold,
``layer_in`` and the model-level probes included. It is judged against
llama.cpp's plain path (flash attention off, F32 cache: the reference), HF,
and the float64 oracle (HF in float64 from the same tokens): against either
reference, its distance to the oracle must stay within ``ratio`` times the
reference's own, floored at its precision (``harness/case.py`` ``oracle_for``).

Its precision is float16 whatever KV cache is asked for: the flash-attention
graph casts an F32 cache to F16 before the kernel (src/llama-graph.cpp
``build_attn_mha``: ``if (k->type == GGML_TYPE_F32) k = ggml_cast(ctx0, k,
GGML_TYPE_F16)``, the same for V), and the CPU kernel rounds Q to K's dot type
and accumulates V in F16 (ggml/src/ggml-cpu/ops.cpp
``ggml_compute_forward_flash_attn_ext_f16_one_chunk``: ``q_to_vec_dot``,
``VKQ16``, ``ggml_vec_mad_f16``). Measured (llama, 16 tokens): the F32-cache
and F16-cache flash paths are bit-identical, and differ from the plain path by
NMSE 2.6e-7 at attn_heads -- 7e-8 at 1024 tokens; a Q8_0 cache is judged at
kv_q8_0's. ``attn_probs`` is not exposed: the fused kernel materialises no
probabilities (no ``kq_soft_max`` node).
"""

from __future__ import annotations

from .api import Candidate, CandidateCapture
from harness.references.llamacpp.capture import available
from ..errors import UsageError
from .. import references
from ..policy import comparison_dtype
from contract.probes import LAYER_PROBES

BLOCK = {"q8_0": 32}  # ggml block sizes of the quantized cache types (ggml/src/ggml.c type_traits)
# kv_q8_0: a Q8_0 cache's own table (fixtures/tolerance.toml), apart from q8_0 -- the
# activation rounding of quantized WEIGHTS, against which HF vs llama.cpp is judged
PRECISION = {"f32": "float16", "f16": "float16", "q8_0": "kv_q8_0"}


class FlashAttn(Candidate):
    teacher_forced = False
    ragged = True  # the reference's own decode calls (plan_calls), ragged or not

    def __init__(self, kv_type: str = "f32"):
        self.kv_type = kv_type
        self.description = (f"llama.cpp with flash attention on, {kv_type.upper()} KV cache (free-running, against "
                            "llama.cpp's plain path, HF and the float64 oracle)")

    @property
    def engine(self) -> dict:
        return {"flash_attn": True, "type_k": self.kv_type, "type_v": self.kv_type}

    def validate(self, case) -> None:
        bad = [r for r in case.ref.split(",") if r not in references.choices()]
        if bad:
            raise UsageError(f"candidate {self.name} is judged against {', '.join(references.choices())} "
                             f"(several comma-separated), not {bad[0]!r}")
        if not available():
            raise UsageError(f"candidate {self.name} runs llama.cpp: pip install -e '.[llamacpp]'")

    def unsupported(self, run) -> str | None:
        if not run.family.gguf_arch and run.source is None:
            return f"family {run.family.name} has no llama.cpp architecture (no GGUF export)"
        block = BLOCK.get(self.kv_type)
        if block:
            # llama_init_from_model refuses a quantized cache whose block does not divide
            # a head (src/llama-context.cpp: "K cache type ... does not divide n_embd_head_k")
            for lc in run.layer_cfgs:
                widths = _cache_widths(lc)
                bad = [w for w in widths if w % block]
                if bad:
                    return (f"llama.cpp refuses a {self.kv_type} KV cache here: its block of {block} does not divide "
                            f"the head width {bad[0]} (src/llama-context.cpp llama_init_from_model); "
                            "set a head_dim divisible by it, e.g. --set head_dim=32")
        return None

    def capture(self, run, rc) -> CandidateCapture:
        # one free run serves every reference: llama.cpp's own capture, with the engine's settings
        c = run.memo(f"capture_{self.name}", lambda: references.get("llamacpp").capture(
            run.request(), engine=self.engine, capture_name=self.name))

        precision = comparison_dtype(PRECISION[self.kv_type], run.weight_dtype)
        cap = CandidateCapture(self.name, precision, dict(c.probes), meta=dict(c.meta), note=(
            f"{self.name} is judged at {precision}: "
            + ("the flash-attention graph casts an F32 KV cache to F16 (src/llama-graph.cpp build_attn_mha: "
               "`if (k->type == GGML_TYPE_F32) k = ggml_cast(ctx0, k, GGML_TYPE_F16)`) and the CPU kernel "
               "accumulates V in F16 (ggml-cpu/ops.cpp ggml_compute_forward_flash_attn_ext_f16_one_chunk: VKQ16)"
               if self.kv_type != "q8_0" else "its KV cache holds Q8_0 blocks (8-bit values, one F16 scale per 32)")))

        cap.not_exposed["attn_probs"] = ("flash attention materialises no probabilities: ggml_flash_attn_ext "
                                         "replaces kq_soft_max (src/llama-graph.cpp build_attn_mha)")
        # what llama.cpp's plain path exposes, the flash path must too: a probe the plain
        # graph names no tensor for (or one only in another form, MLA's absorbed graph)
        # is not exposed here either; one it has that this run lacks stays missing
        plain = run.capture("llamacpp")
        for i in range(len(run.layer_cfgs)):
            for probe in LAYER_PROBES:
                key = f"L{i}.{probe}"
                if key not in c.probes and key not in plain.probes:
                    cap.not_exposed[key] = f"llama.cpp's {run.family.gguf_arch} graph names no tensor for it"
        return cap


def _cache_widths(lc) -> list[int]:
    """The per-head widths of a layer's K and V cache rows, as llama.cpp sizes them."""
    if getattr(lc, "kind", None) == "mla":  # MLA: the latent row (+ the rope slice for K)
        return [lc.kv_lora_rank + (lc.qk_rope_head_dim or 0), lc.kv_lora_rank]
    if getattr(lc, "shape", None) == "gqa":
        return [lc.head_dim, lc.dv]
    return []


FA = FlashAttn("f32")
FA_KV_F16 = FlashAttn("f16")
FA_KV_Q8_0 = FlashAttn("q8_0")
