"""``hf-sdpa`` and ``hf-flex``: transformers' own SDPA and FlexAttention paths
(``attn_implementation``) as candidates, judged against the eager reference.

The model is the case's own (the same seeded weights), switched with
``PreTrainedModel.set_attn_implementation``; each decoder layer is fed the
reference's input to it (teacher forcing, the same forward pre-hook the float64
oracle uses), so a difference is the attention path's, layer by layer. The
probes are read as the eager reference reads them, the wrapped function being
transformers' registered ``sdpa`` / ``flex_attention`` one
(``harness/references/hf/capture.py``). Where transformers refuses the path, or keeps eager
without saying so, the case is ``skipped`` with that reason -- never a pass of
a path that did not run.
"""

from __future__ import annotations

import copy
import inspect

from .api import Candidate, CandidateCapture
from contract.probes import LAYER_PROBES
from .. import references, verdict

NO_PROBS = {
    "sdpa": "transformers' sdpa_attention_forward returns no attention weights (integrations/sdpa_attention.py)",
    "flex_attention": "transformers' flex_attention_forward returns the log-sum-exp, not the weights "
                      "(integrations/flex_attention.py)",
}


class HfAttention(Candidate):
    teacher_forced = True
    ragged = True  # HF's full forward over every sequence: no schedule (rows past a sequence's length are not compared)

    def __init__(self, implementation: str):
        self.implementation = implementation
        self.description = (f"transformers' attn_implementation={implementation!r} on the case's model, "
                            "teacher-forced, against the eager reference")

    def unsupported(self, run) -> str | None:
        model = run.base_model
        cls = type(model).__name__
        try:
            probe = copy.deepcopy(model)
            probe.set_attn_implementation(self.implementation)
        except (ValueError, ImportError) as e:
            where = _refusal_source(type(model), self.implementation)
            return (f"transformers refuses {self.implementation} for {cls}: {where}" if where
                    else f"transformers refuses {self.implementation} for {cls}: {' '.join(str(e).split())[:240]}")
        got = probe.config._attn_implementation
        if got != self.implementation:
            # bloom, mpt: the attention math is inline (no attention interface), and
            # set_attn_implementation returns having kept eager
            return (f"transformers keeps attn_implementation={got!r} for {cls} when asked for "
                    f"{self.implementation!r} (its attention is computed inline, not through "
                    "ALL_ATTENTION_FUNCTIONS): the path does not exist for this family")
        if self.implementation == "flex_attention" and run.case.device == "cpu":
            sinks = any("sinks" in w for w in run.weights_for("float32"))
            if sinks:
                return ("transformers' flex_attention_forward refuses attention sinks on the CPU "
                        "(integrations/flex_attention.py: 'Attention sinks cannot be run on CPU with flex attention')")
        return None

    def capture(self, run, rc) -> CandidateCapture:
        hf = references.get("hf")
        c = hf.capture(run.request(), run.case.dtype, run.weights_dtype(rc), force=rc,
                       attn_implementation=self.implementation)
        # the attention half only, as impl is judged: layer_out and the logits add HF's
        # FFN and head, which the attention path does not change
        half = [p for p in LAYER_PROBES if p not in ("layer_in", "layer_out")]
        probes = {k: v for k, v in c.probes.items() if k.startswith("L") and k.split(".", 1)[1] in half}
        cap = CandidateCapture(self.name, run.case.dtype, probes, meta=dict(c.meta))
        cap.not_exposed["attn_probs"] = NO_PROBS[self.implementation]
        # what eager HF computes no tensor for (MLA's absorbed query: HF computes the
        # naive form) no attention path of HF exposes; anything else it lacks is missing
        eager = hf.capture(run.request(), run.case.dtype)
        for i, lc in enumerate(run.layer_cfgs):
            for probe in verdict.expected_probes(lc):
                key = f"L{i}.{probe}"
                if key not in probes and key not in eager.probes:
                    cap.not_exposed[key] = f"transformers' {run.family.hf_model_type} computes no such tensor"
        return cap


def _refusal_source(cls, implementation: str) -> str:
    """Where transformers says the model class lacks the path: the
    ``_supports_sdpa`` / ``_supports_flex_attn = False`` line (with its comment),
    by file and line; '' when no such line is found."""

    flag = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn"}.get(implementation)
    owner = next((k for k in cls.__mro__ if flag in vars(k)), None)
    if owner is None or vars(owner)[flag]:
        return ""
    try:
        lines, start = inspect.getsourcelines(owner)
    except (OSError, TypeError):
        return f"{owner.__name__}.{flag} = False"
    for n, line in enumerate(lines):
        if line.strip().startswith(f"{flag} ="):
            path = inspect.getsourcefile(owner) or "?"
            rel = path[path.find("transformers/"):] if "transformers/" in path else path
            return f"{owner.__name__}: {line.strip()} ({rel}:{start + n})"
    return f"{owner.__name__}.{flag} = False"


SDPA = HfAttention("sdpa")
FLEX = HfAttention("flex_attention")
