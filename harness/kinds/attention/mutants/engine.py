"""Mutants of the bugs a real engine writes that the matrix could not see
(issue 28): 23 bugs planted at impl's API points, five missed by one
reference or both -- each because the harness never built the case that shows
it, not for want of tolerance:

- a ragged batch's position mix-up (sequences in lockstep sit at the same
  positions, so a sequence that takes another's position passes): killed by
  the ragged cases (``--ragged``, harness/schedule.py);
- a float16 softmax kept in the input dtype with no max subtracted, and
  ``attn @ V`` summed key by key in the input dtype (O(1) scores and 16-32
  tokens round them away): killed by the realistic-weights cases at float16
  and bfloat16, and the 256-token bfloat16 ones;
- a norm's epsilon outside the square root, which impl at float64 against
  llama.cpp alone used to pass at float32's bound: killed now that such a
  comparison is judged against the reference's own rounding as well
  (pipeline/oracle.py ``rounding_of``);
- a chunk's first query reading the previous chunk: llama.cpp hard-codes
  llama4's chunk at 8192, so only HF judges a chunked case (against llama.cpp
  alone the case is unguarded, and says to use --ref hf).
"""

from ...mutant import Mutant
from .features3_alibi_chunk import LLAMA4_CHUNK

LOW = ("float16", "bfloat16")
REALISTIC_F16 = {"family": "llama", "backend": "torch", "dtype": "float16", "weights": "realistic", "kv": "paged",
                 "tokens": 24}
LONG_BF16 = {"family": "llama", "backend": "torch", "dtype": "bfloat16", "weights": "realistic", "kv": "paged",
             "tokens": 256, "schedule": "prefill"}

MUTANTS = [
    Mutant("ragged-position-from-first-sequence", "kv_ragged", "impl.runner",
           "one(s, start, size, batch_pos[j])", "one(s, start, size, batch_pos[0])",
           {"family": "llama", "kv": "batched", "seqs": 3, "ragged": True}, "q_rope",
           doc="every sequence of a batched call takes the first sequence's query position (the batch's "
               "position vector read at 0): the same in lockstep, wrong once sequences differ in arrival and "
               "length (issue 28: 70.0 apart on sequences of 8 and 6 rows)"),
    Mutant("softmax-low-precision-no-max", "gqa", "impl.attention",
           "e = xp.exp(scores - m)\n        probs = e / xp.sum(e, axis=-1, keepdims=True)",
           "e = xp.exp(xp.astype(scores, qh.dtype))\n        probs = e / xp.sum(e, axis=-1, keepdims=True)",
           REALISTIC_F16, "attn_probs", core=True, dtypes=("float16",),
           doc="the softmax in the input dtype with no max subtracted: exp overflows float16 (65504) once a "
               "score passes 11.1, which a trained model's scores do; bfloat16's range hides it",
           bisect_note="the softmax is in every attention; no feature tag names it (and at O(1) scores it is "
                       "right to rounding)"),
    Mutant("attn-v-accumulated-in-input-dtype", "gqa", "impl.attention",
           "out = xp.matmul(xp.astype(probs, vh.dtype, copy=False), vh)  # [H, n, Dv]",
           "pv = xp.astype(probs, vh.dtype, copy=False)\n"
           "    out = pv[:, :, 0:1] * vh[:, 0:1, :]  # [H, n, Dv], summed key by key in the input dtype\n"
           "    for j in range(1, vh.shape[1]):\n"
           "        out = out + pv[:, :, j:j + 1] * vh[:, j:j + 1, :]",
           LONG_BF16, "attn_heads", core=True, dtypes=LOW,
           doc="attn @ V summed key by key in the input dtype (each partial sum rounded to bfloat16 / float16) "
               "instead of a float32-accumulated product: lost at 256 tokens on a trained model's values, "
               "inside the rounding at 16 tokens",
           bisect_note="the value sum is in every attention; no feature tag names it"),
    Mutant("norm-eps-outside-sqrt", "gqa", "impl.norms",
           "y = xf / xp.sqrt(var + spec.eps)", "y = xf / (xp.sqrt(var) + spec.eps)",
           {"family": "llama", "dtype": "float64", "ref": "llamacpp"}, "attn_in", core=True,
           dtypes=("float64", "float32"),
           doc="x / (sqrt(var) + eps) for x / sqrt(var + eps): NMSE ~1e-10 at attn_in, under float32's bound "
               "of impl at float64 against llama.cpp alone (issue 28: 8.6e-11 < 1e-10)",
           bisect_note="the epsilon of every norm (input, QK, post) is in every layer; no feature tag names it"),
    Mutant("chunk-boundary-query-sees-previous-chunk", "chunked_window", "impl.config",
           "return (q_pos // window.size) * window.size", "return ((q_pos - 1) // window.size) * window.size",
           LLAMA4_CHUNK, "attn_probs",
           doc="a chunk's first query (position a multiple of the chunk) also reads the whole previous chunk: "
               "the boundary taken as inclusive; every other query is right"),
]
