"""llama.cpp (through llama-cpp-python) as a reference (``--ref llamacpp``).

The GGUF is the family's export of the case's HF weights (written the way
``convert_hf_to_gguf.py`` writes it: harness/pipeline/gguf/export.py and each family's
converter steps) or the user's own file; the capture runs in a subprocess
(``worker.py``) with the eval callback reading the graph's named tensors
(``capture.py``), so a crash inside llama.cpp is an error row and the run goes
on. Its graph computes in float32 whatever the case's dtype, and on quantized
weights ggml's CPU first quantizes each activation row to the weight type's
``vec_dot_type`` (``ggml_matmul.py`` reproduces that rounding for a candidate
that wants to be judged at the tight ``ggml_<act>`` bound).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import Reference
from ...errors import UsageError
from ...versions import _version, per_llama_build
from . import ggml_ctypes
from .capture import capture_for_case, available, abort, resume, tokenize

# the llama-cpp-python release whose vendored ggml.h the struct mirror was written from
LAYOUT_OF = "0.3.36"


class LlamaCpp(Reference):
    label = "llama.cpp"
    graph_dtype = "float32"
    file_weights = True
    default_for_file = True
    runs_apart = True
    requires = "llamacpp"

    def available(self) -> bool:
        return available()

    def abort(self) -> None:
        abort()

    def resume(self) -> None:
        resume()

    def refusal(self, family, config) -> str | None:
        """The family's own word where the converter writes ``config`` as another arch, or
        llama.cpp cannot run it (``Family.gguf_export_refusal``)."""
        return family.gguf_export_refusal(config)

    def config_refusal(self, family, config) -> str | None:
        """What llama.cpp's graph, loader or converter cannot hold, as the family declares
        it (``lc_refusal``)."""
        return family.lc_refusal(config)

    def preflight(self, family, config) -> None:
        """The ``ggml_tensor`` layout the eval callback reads (ggml_ctypes.py) checked
        against the library being loaded: a release that moved a field is refused in
        one line, not read as garbage arrays. Kept in the cache per library build."""

        def measure():
            try:
                return ggml_ctypes.layout_mismatch(ggml_ctypes.ggml_base_path())
            except (OSError, RuntimeError) as e:
                return f"libggml-base cannot be read ({e})"

        src = hashlib.sha256(Path(ggml_ctypes.__file__).read_bytes()).hexdigest()[:16]
        bad = per_llama_build("llama_cpp_layout", src, measure)
        if bad:
            raise UsageError(f"llama-cpp-python {_version('llama_cpp_python')}: {bad}; the capture's mirror "
                             "(harness/references/llamacpp/ggml_ctypes.py) is llama-cpp-python "
                             f"{LAYOUT_OF} (docs/how-to/reference-released.md)")

    def capture(self, req, engine: dict | None = None, capture_name: str | None = None):
        return capture_for_case(req, engine, capture_name or self.name)

    def tokenize(self, gguf_path, text: str) -> list[int]:
        """``text`` in the file's own vocabulary (llama.cpp's tokenizer): the ids every
        side of a ``--prompt`` case takes."""

        return tokenize(gguf_path, text)

    def estimate(self, ctx) -> dict:
        """The worker's peak: the GGUF, its KV cache (one stream per sequence, 256
        cells a step), the graph's compute buffer (kq and the logits); its probes are
        then assembled in the parent one at a time, in ggml's float32
        (capture.py assemble): the logits are the largest."""
        s, t = ctx.seqs, ctx.tokens
        n_ctx = max(256, -(-t // 256) * 256)
        kv = s * n_ctx * sum(d[2] * (d[3] + d[4]) for d in ctx.dims) * 4
        compute = 4 * (s * ctx.hmax * (t // 2 + 1) * n_ctx * 2 + s * t * ctx.vocab)
        gguf = ctx.file_bytes or (ctx.pc.gguf_bytes if ctx.gguf_type == "f32" else ctx.pc.gguf_bytes // 2)
        lc_bytes = max(gguf + kv + compute, 4 * max(s * t * ctx.vocab if ctx.want_logits else 0, ctx.largest_probe))
        return {"parts": {"llama.cpp": lc_bytes},
                "phases": {"gguf export": ctx.pc.largest_tensor * 4 * 2, "llama.cpp capture": lc_bytes}}
