"""The candidate protocol: what an engine implements to be judged by the harness.

A candidate is the side of a comparison being checked. ``impl`` is the default
one; any other engine plugs in by an entry point of the group
``attn_conformance.candidates`` (see ``registry``), so a user's package
registers its own without touching this project::

    # the user's pyproject.toml
    [project.entry-points."attn_conformance.candidates"]
    my-engine = "my_engine.conformance:MyCandidate"

The smallest candidate is a ``LayerCandidate``: ONE method, ``run_layer``,
given exactly what impl is given for one decoder layer (``LayerCall``: the
layer's description -- ``impl.LayerConfig`` or ``impl.MlaConfig`` -- its
weights by impl's names in HF ``nn.Linear`` layout, each sequence's input rows
to the layer, the KV backing and the rows per call), returning the probes it
can expose by our names (``contract.probes``; shapes in
``PROBE_SHAPES``). The harness feeds it each reference's own input to the layer
(teacher forcing), so every layer is judged on its own, and judges what comes
back by the verdict rules (README "Verdict rules"): a probe it cannot expose is
returned as ``NotExposed(reason)`` and reported ``not-exposed`` -- never a
pass; a probe the layer's kind must emit that it neither returns nor declares
is ``missing`` and fails; an exception is an ``error`` row for that layer.

Engines that run a whole model (a transformers attention backend, llama.cpp
with other settings) subclass ``Candidate`` and implement ``capture`` over the
whole case; ``teacher_forced = False`` says it runs free from the tokens, so
its ``layer_in`` and the model-level probes are compared too and its bounds
carry every upstream layer's rounding. Engines outside Python write dumps
(``harness/candidates/dump.py``; ``conformance export-case`` / ``judge``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
import traceback

import numpy as np

from contract.candidate import PROBE_SHAPES, CandidateCapture, LayerCall, NotExposed  # noqa: F401 (re-exported)
from contract.probes import PROBES
from .. import kinds, runlog

GROUP = "attn_conformance.candidates"
DEFAULT = "impl"


class Candidate(ABC):
    """An engine judged by the harness. ``name`` is set from its entry point."""
    name: str = ""
    description: str = ""
    # True: fed each reference's input to every layer (only that layer's own
    # rounding is judged); False: runs free from the tokens (layer_in and the
    # model-level probes are compared too)
    teacher_forced: bool = True
    # the modules whose code the candidate runs, and the functions of them it
    # replaces: a mutant (harness/mutants) applies to the candidate when its
    # snippet lies in one of these modules and not in a replaced function
    runs_modules: tuple = ()
    replaces: tuple = ()
    # True: it runs sequences of different lengths, first-call sizes and arrivals
    # (``--ragged``: it reads ``LayerCall.steps``, or runs no schedule at all); False: a
    # ragged case is skipped, saying so -- it was written for one chunk plan for every
    # sequence (``LayerCall.chunks``)
    ragged: bool = False
    # True: it runs a layer that reads another layer's K/V (``LayerConfig.kv_source``,
    # gemma3n's shared layers) from ``LayerCall.source``; False: a case with such a layer is
    # skipped, saying so
    reads_kv_source: bool = False
    # True: it reads nothing of the case beyond a LayerCall (and the run's case, layer
    # descriptions and selection), so a case whose captures are all cached may run it from
    # the case's record without building the HF config or the model (harness/warm.py)
    warm_path: bool = False
    # the distributions of the engine it runs where that engine computes the model itself
    # (onnxruntime, openvino, ...); empty for one that runs impl's code or a reference's (impl,
    # hf-sdpa, llamacpp-fa). Only such an engine can say whom it computes like where HF and
    # llama.cpp disagree (``conformance divergences --triangulate NAME``): one running HF's or
    # llama.cpp's code would side with its own by construction. The table records these releases.
    engine_packages: tuple = ()

    def validate(self, case) -> None:
        """Raise ``UsageError`` (one line) for a case this candidate can never run."""
    def unsupported(self, run) -> str | None:
        """Why this candidate cannot run this case (a ``skipped`` row naming the
        engine's limit), or None."""
        return None

    def mutant_case_fields(self) -> dict:
        """Case fields a case needs to run this candidate (``conformance mutate
        --candidate`` sets them on the spec's and the mutants' own cases)."""
        return {}

    @abstractmethod
    def capture(self, run, rc) -> CandidateCapture:
        """The candidate's probes for one reference capture ``rc`` (its layer
        inputs are ``rc.probes["L{i}.layer_in"]``). ``run``: the
        ``harness.case.CaseRun`` (case, config, layer_cfgs, weights_for, tokens,
        base_model)."""


class LayerCandidate(Candidate):
    """A candidate that computes one decoder layer at a time: implement
    ``run_layer``. Layers the harness has no description for (``contract.layers.Unimplemented``:
    linear-attention layers) are not given to it."""

    teacher_forced = True

    def dtype(self, run) -> str:
        return run.case.dtype

    @abstractmethod
    def run_layer(self, call: LayerCall) -> dict:
        """``{probe: array [S, ...] | NotExposed}`` for one layer (see
        ``PROBE_SHAPES``); raise to report an error for this layer."""

    def capture(self, run, rc) -> CandidateCapture:
        """Every selected layer's ``capture_layer``, gathered (the harness itself
        compares one layer at a time and never holds them all)."""
        cap = CandidateCapture(self.name, self.dtype(run))
        for i in run.selection.layers:
            one = self.capture_layer(run, rc, i)
            cap.probes.update(one.probes)
            cap.not_exposed.update(one.not_exposed)
            cap.errors.update(one.errors)
            cap.layer_dtypes.update(one.layer_dtypes)
        return cap

    def capture_layer(self, run, rc, i: int) -> CandidateCapture:
        """Layer ``i`` alone, fed ``rc``'s own input to it, on that layer's weights
        only (made when asked: a real-size run never holds every layer's); empty
        for a layer with no description (``Unimplemented``) or no input in ``rc``."""

        case = run.case
        cap = CandidateCapture(self.name, self.dtype(run))
        lc = run.layer_cfgs[i]
        key = f"L{i}.layer_in"
        if not kinds.implemented(lc) or key not in rc.probes:
            return cap
        try:
            x = rc.probes[key]
            plan = run.batch_plan

            def layer_call(j: int, source=None):
                xj = rc.probes[f"L{j}.layer_in"]
                # each sequence's own rows (a ragged case's are of different lengths)
                inputs = [np.asarray(xj[s, : plan.lengths[s]]) for s in range(xj.shape[0])]
                return LayerCall(j, run.layer_cfgs[j], run.layer_weights_for(run.weights_dtype(rc), j), inputs,
                                 case.kv, () if plan.ragged else plan.chunks[0], case.page_size, case.seed,
                                 case.evict, case.backend, case.device, case.dtype, run.family.name,
                                 run.ggml_act_types(rc, j), steps=plan.steps(), source=source)

            src = getattr(lc, "kv_source", None)
            if src is not None and f"L{src}.layer_in" not in rc.probes:
                raise ValueError(f"layer {i} reads layer {src}'s K/V (kv_source) and {rc.name} holds no "
                                 f"L{src}.layer_in; select layer {src} too")
            call = layer_call(i, None if src is None else layer_call(src))
            got = self.run_layer(call)
        except Exception as e:  # the candidate crashed: an error row for this layer, the run goes on

            cap.errors[i] = f"{self.name} raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            cap.details[i] = traceback.format_exc()
            runlog.traceback_block(f"{run.case.case_id()}: candidate {self.name}, layer {i} ({rc.name}'s inputs)",
                                   cap.details[i])
            return cap
        ldt = run.ggml_layer_dtype(rc, call)  # after run_layer: it reads what the candidate met (call.ggml_met)
        if ldt:
            cap.layer_dtypes[i] = ldt
        for probe, arr in got.items():
            if isinstance(arr, NotExposed):
                cap.not_exposed[f"L{i}.{probe}"] = arr.reason
            elif run.selection.probe(probe):
                cap.probes[f"L{i}.{probe}"] = padded(probe, arr, x.shape[1])
        return cap


def kv_source_limit(cand: Candidate, descs) -> str | None:
    """Why a teacher-forced candidate cannot be handed these layers (a ``skipped`` row), or
    None: one reads another layer's K/V (``kv_source``) and the candidate does not say it runs
    the source its ``LayerCall.source`` names (``reads_kv_source``)."""
    if cand.reads_kv_source or not cand.teacher_forced:
        return None
    readers = [i for i, d in enumerate(descs) if getattr(d, "kv_source", None) is not None]
    if not readers:
        return None
    return (f"candidate {cand.name} does not run a layer that reads another layer's K/V (layers {readers}: "
            "LayerConfig.kv_source, the source's LayerCall is LayerCall.source; docs/how-to/add-a-candidate.md)")


def padded(probe: str, arr, n_tokens: int) -> np.ndarray:
    """A candidate's probe as one ``[S, ...]`` array: a stacked array as it is, or
    one array per sequence (a ragged case's sequences differ in length) zero-padded
    along its token axes to ``n_tokens`` -- the rows past a sequence's length are
    not compared (``harness.schedule.mask``)."""

    if not isinstance(arr, (list, tuple)):
        return np.asarray(arr)
    parts = [np.asarray(a) for a in arr]
    p = PROBES.get(probe)
    axes = p.axes[1:] if p is not None else ()
    if len({a.ndim for a in parts}) > 1:
        raise ValueError(f"{probe}: the sequences' arrays have different ranks {[a.shape for a in parts]}")
    # to the case's tokens, or further where a sequence's array is longer (a wrong grid: the
    # judge then reports the shape mismatch against the reference, never a silent cut)
    full = [max(a.shape[d] for a in parts) for d in range(parts[0].ndim)]
    out = []
    for a in parts:
        names = axes if len(axes) == a.ndim else ("tok",) + ("-",) * (a.ndim - 1)
        pad = [(0, max(full[d], n_tokens) - a.shape[d]) if names[d] in ("tok", "key") else (0, full[d] - a.shape[d])
               for d in range(a.ndim)]
        out.append(np.pad(a, pad))
    return np.stack(out)
