"""``ctranslate2``: CTranslate2's own converter and generator, judged free-running.

The case's model is saved as an HF checkpoint and converted by CTranslate2's
``TransformersConverter`` (its per-config loaders, ``ctranslate2/converters/
transformers.py``: ``@register_loader("LlamaConfig")`` ...) at
``quantization="float32"``, then run by its C++ ``Generator`` on the CPU
(``compute_type="float32"``). Its Python API returns the decoder's logits
(``Generator.forward_batch``: "the full output logits for each position") and
nothing from inside the decoder, so every layer probe and ``embeddings`` /
``final_norm`` are ``not-exposed`` with that reason; the logits are judged
against both references and the free float64 oracle (every layer flows into
them: ``harness/verdict.py`` lets a passing ``logits`` guard the layers of an
engine that exposes no layer tensor, and says so).

A family whose config class the converter has no loader for is ``skipped``
with the converter's own message ("No conversion is registered for the model
configuration ...").
"""

from __future__ import annotations

import numpy as np

from ..api import Candidate, CandidateCapture
from . import checkpoint, require, said, scratch, version
from harness.lazy import lazy
from contract.probes import LAYER_PROBES

ctranslate2_converters = lazy("ctranslate2.converters")

NOT_EXPOSED = ("CTranslate2's Generator returns only logits (forward_batch: 'the full output logits for each "
               "position'); no layer tensor leaves its C++ decoder")


class CTranslate2(Candidate):
    teacher_forced = False
    engine_packages = ("ctranslate2",)
    description = ("CTranslate2: its TransformersConverter and C++ Generator on the CPU, float32, free-running; "
                   "logits only (the extra .[engines])")

    def validate(self, case) -> None:
        require("ctranslate2", self.name)

    def unsupported(self, run) -> str | None:
        if run.case.dtype != "float32":
            return f"{self.name} converts and computes at float32 (quantization / compute_type), not {run.case.dtype}"
        ok, why = self._converted(run)
        return None if ok else why

    def _converted(self, run):
        def make():
            ct2 = require("ctranslate2", self.name)

            out = scratch(run, "ctranslate2")
            try:
                ctranslate2_converters.TransformersConverter(str(checkpoint(run)), low_cpu_mem_usage=False).convert(
                    str(out), quantization="float32", force=True)
                gen = ct2.Generator(str(out), device="cpu", compute_type="float32", inter_threads=1, intra_threads=1)
            except Exception as e:  # the converter's own refusal: a skipped case in its words
                return False, f"ctranslate2 {version('ctranslate2')} converter: {said(e)}"
            return True, gen
        return run.memo("ctranslate2_model", make)

    def capture(self, run, rc) -> CandidateCapture:
        def make():
            ok, gen = self._converted(run)
            if not ok:
                raise RuntimeError(gen)
            logits = [np.asarray(gen.forward_batch([[int(t) for t in row]]), dtype=np.float64)[0]
                      for row in run.tokens]
            return np.stack(logits)

        logits = run.memo("ctranslate2_logits", make)
        cap = CandidateCapture(self.name, "float32", {"logits": logits},
                               meta={"engine": f"ctranslate2 {version('ctranslate2')}"})

        for p in (*LAYER_PROBES, "embeddings", "final_norm"):
            cap.not_exposed[p] = NOT_EXPOSED
        return cap
