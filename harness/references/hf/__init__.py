"""HF transformers as a reference (``--ref hf``).

The model is the case's own (built from the family's tiny config with seeded
weights, a checkpoint, or a GGUF read back), run eagerly with forward hooks
at the family's probe points and the family's eager attention function
wrapped (``capture.py``). It is also the float64 oracle: the same model
computed module by module in float64 (``float64.py``), teacher-forced on
another capture's own layer inputs, so a low-precision comparison tells a bug
from rounding (README "Verdict rules", docs/explanation/oracle-and-tolerance.md).
"""

from __future__ import annotations

from pathlib import Path
import contextlib
import copy

from contract.probes import STATE_PROBES

from .. import Reference
from ..capture import RefCapture
from .hook_points import check
from ... import cache
from ...versions import versions
from . import capture as hf
from .float64 import __file__ as f64_file
from ..llamacpp import ggml_matmul

CAPTURE_SCHEMA = 2  # bump when the meaning of a stored capture changes (2: a directory of .npy, harness/store.py)


class HF(Reference):
    label = "HF transformers"
    oracle = True
    sees_modules = True
    # False: ONE forward without a cache (the model as a whole); True: HF's own cached path
    # on the case's schedule (harness/references/hf_cached)
    cached = False

    def config_refusal(self, family, config) -> str | None:
        """What HF's modeling file crashes on, as the family declares it (``hf_refusal``)."""
        return family.hf_refusal(config)

    def preflight(self, family, config) -> None:
        """The hook points this adapter reads in transformers (hook_points.py)."""
        check(family, config, cached=self.cached)

    def calls(self, req) -> list[int] | None:
        """The chunk sizes of HF's calls: None (one forward, no cache)."""
        return None

    def not_exposed(self) -> dict[str, str]:
        """Why a probe is absent from every capture of this reference."""
        return {p: "HF's full forward is ONE call without a cache: the state between calls is HF's cached path's "
                   "(reference hf_cached)" for p in STATE_PROBES}

    def capture(self, req, dtype: str | None = None, weights: str | None = None, force: RefCapture | None = None,
                attn_implementation: str = "eager", rounding: dict | None = None) -> RefCapture:
        """HF computing in ``dtype`` (default: the case's planned one) on its weights
        as held in ``weights`` (default: ``dtype``); ``force``: teacher-force every
        decoder layer with that capture's own layer inputs (the float64 oracle);
        ``attn_implementation``: transformers' attention path (the reference is
        eager; the hf-sdpa / hf-flex candidates take the others). ``req``: the
        case's ``CaptureRequest``."""

        dtype = dtype or req.hf_dtype
        weights = weights or dtype
        sel = req.selection
        case = req.case

        src = cache.source_hash(*cache.family_sources(req.family), Path(hf.__file__), Path(f64_file),
                               *req.family_base_sources, *((Path(ggml_matmul.__file__),) if rounding else ()))
        calls = self.calls(req)
        k = cache.key("hf", CAPTURE_SCHEMA, req.family.name, req.config.to_json_string(use_diff=False),
                      case.seed, req.tokens.tolist(), dtype, case.hf_model, req.checkpoint_stamp,
                      versions().get("torch"), versions().get("transformers"), src,
                      *((["switch_off", list(case.switch_off)],) if case.switch_off else ()),
                      *((["weights", case.weights],) if case.weights != "random" else ()),
                      *req.weights_stamp,
                      *((["weights", weights],) if weights != dtype else ()),
                      *((["forced_by", force.key],) if force is not None else ()),
                      *((["selection", sel.label()],) if sel.label() else ()),
                      *((["attn_implementation", attn_implementation],) if attn_implementation != "eager" else ()),
                      *((["calls", calls],) if calls is not None else ()),
                      *((["ggml_rounding", sorted(rounding.items())],) if rounding else ()))
        hit = cache.load("hf", k)
        if hit is not None:
            return RefCapture(self.name, dtype, hit[0], meta=hit[1], cached=True, key=k)
        # the weights as held (float32, or the case's bfloat16 / float16 copy); a float64
        # run computes on them module by module with every float32 side path of HF's
        # modeling code promoted (float64.py), so it is judged at float64
        model, how = req.model(weights)
        if attn_implementation != "eager":  # a candidate's attention path, on a copy: the reference stays eager

            model = copy.deepcopy(model)
            model.set_attn_implementation(attn_implementation)
        meta = {"family": req.family.name, "dtype": dtype, "weights": weights, **({"built_by": how} if how else {}),
                "not_exposed": {**self.not_exposed(), **req.family.hf_not_exposed}, **({"calls": len(calls)} if calls is not None else {}),
                **({"ggml_rounding": len(rounding)} if rounding else {})}
        forced = None if force is None else {k2: force.probes[k2] for k2 in force.probes if k2.endswith(".layer_in")}
        # each probe goes to disk as HF computes it (harness/store.py); the oracle stops
        # after the last layer it is asked for

        rounded = ggml_matmul.rounded_linears(model, rounding) if rounding else contextlib.nullcontext()
        with cache.writer("hf", k, keep=sel.key) as w, rounded:
            hf.capture(req.family, model, req.config, list(req.layer_cfgs), req.tokens, meta, force_inputs=forced,
                       sink=w, layers=sel.layers, probes=sel.probes, float64=dtype == "float64",
                       model_probes=force is None and sel.model_probes, attn_implementation=attn_implementation,
                       calls=calls, float64_keep=getattr(req, "float64_keep", 0))
            probes = cache.finish(w, meta)
        return RefCapture(self.name, dtype, probes, meta=meta, key=k)

    def estimate(self, ctx) -> dict:
        """HF runs in this process: one layer's activations and the eager attention,
        and the logits read back (harness/budget.py)."""
        b = ctx.bytes(ctx.hf_dtype)
        forward = ctx.forward(b)
        return {"parts": {"forward": forward, "logits": ctx.logits(b)},
                "phases": {"hf capture": forward + ctx.logits(b)}}


# The transformers releases the adapter has been run on (the default matrix on each, and
# `conformance upstream transformers 5.20.0..5.25.0`: docs/measurements/2026-12-06-reference-
# versions.md); the calibrated one is the lock's (lock.txt). Before 5.24.0 the cached path
# took `past_key_values` (Mamba models: `cache_params`), not `cache`: hf_cached is refused
# there at start-up, hf alone runs. A release outside runs, its hook points checked
# (hook_points.py), and every report names it; a missing hook point is refused naming
# this window.
SUPPORTED = ("5.24.0", "5.25.0")
