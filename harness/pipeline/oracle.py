"""The oracle stage: the float64 run a low-precision comparison is judged through.

The oracle is a REFERENCE in float64 -- the one whose plug-in says it can be
(``Reference.oracle``: HF, its modeling code computed module by module in
float64) -- never the candidate: an oracle that shared the candidate's code
would excuse its bug. For a teacher-forced candidate it is fed the
lower-precision reference run's own layer inputs (``forced``), so its distance
to that run is the run's own rounding in the layer; for a free-running
candidate it runs free from the same tokens (``free``).
"""

from __future__ import annotations

import time

from .. import references
from ..errors import UsageError
from ..references import RefCapture


def _error(e: Exception) -> RefCapture:
    ref = references.oracle_reference()
    import traceback

    from .. import runlog

    tb = "".join(traceback.format_exception(e))  # called inside the handler: the full traceback
    runlog.traceback_block(f"the float64 oracle ({ref.name if ref else '-'})", tb)
    return RefCapture(ref.name if ref else "-", "float64", error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                      meta={"traceback": tb})


def forced(build, rc: RefCapture) -> RefCapture:
    """The oracle reference in float64 on the weights as ``rc`` holds them, each
    decoder layer fed ``rc``'s own input to it. An error is returned as a capture
    with ``error`` set (the comparison then errors, the run goes on)."""
    t = time.perf_counter()
    try:
        oc = build.capture_ref(references.get(rc.name), dtype="float64", weights=rc.dtype, force=rc)
    except UsageError:
        raise
    except Exception as e:
        oc = _error(e)
    # summed: one forced oracle per reference it serves (hf, hf_cached); the last one's
    # time alone was reported before
    build.timings["capture_hf_oracle"] = build.timings.get("capture_hf_oracle", 0.0) + time.perf_counter() - t
    return oc


def free(build) -> RefCapture:
    """The oracle reference in float64, free-running from the case's tokens on the
    weights the case's own run of it holds (made once per case)."""
    def make():
        t = time.perf_counter()
        try:
            w = build.case.dtype if build.case.dtype in ("float16", "bfloat16") else "float32"
            oc = build.capture_ref(references.oracle_reference(), dtype="float64", weights=w)
        except UsageError:
            raise
        except Exception as e:
            oc = _error(e)
        # summed with the forced oracles: own_rounding may run this beside them in one case
        build.timings["capture_hf_oracle"] = build.timings.get("capture_hf_oracle", 0.0) + time.perf_counter() - t
        return oc

    return build.memo("free_oracle", make)


def oracle_for(build, rc: RefCapture, teacher_forced: bool) -> RefCapture | None:
    """The float64 oracle the candidate is judged through against ``rc``, or None
    (judged directly). A teacher-forced candidate below float64 against the oracle
    reference: ``forced``. A free-running candidate (it runs from the tokens, as the
    references do): the oracle reference in float64, free-running too, against
    either reference, where the comparison dtype's table has an oracle rule. None
    too where the memory plan skipped the oracle (harness/budget.py; every row
    against the oracle's reference says so)."""
    ref = references.get(rc.name)
    if build.plan.skips_oracle and not (ref.oracle and rc.dtype == "float64"):
        return None
    if teacher_forced:
        return forced(build, rc) if ref.oracle and rc.dtype != "float64" else None
    if rc.dtype == "float64" and ref.oracle:
        return rc  # the reference is itself float64 and runs free from the same tokens
    if references.oracle_reference() is None:
        return None
    return free(build)


def drift(build, rc: RefCapture) -> RefCapture | None:
    """The oracle reference run free at ``rc``'s float32 with ggml's activation
    rounding on every quantized ``nn.Linear`` (``ggml_matmul.rounded_linears``):
    the reference made to compute llama.cpp's arithmetic on the same dequantized
    weights. Its distance to ``rc``, probe by probe and layer by layer, is the
    drift that rounding makes on THESE weights at THIS depth -- what the policy
    sizes the free-running llama.cpp vs HF comparison by (``drift_ratio``,
    fixtures/tolerance.toml), instead of a constant fitted on tiny random models.
    None where there is none to measure: float weights, another precision, a
    reference that is not the oracle one, no Linear a quantized tensor feeds.
    Made once per case."""
    import re

    from ..ggml_types import is_quantized
    from ..references.llamacpp.ggml_matmul import linear_act_types, unrounded_params

    ref = references.get(rc.name)
    if not (ref.oracle and rc.dtype == "float32" and build.hf_types and is_quantized(build.case.gguf_type)):
        return None

    def make():
        model, _ = build.hf_model("float32")
        acts = linear_act_types(model, build.hf_types)
        if not acts:
            return None
        t = time.perf_counter()
        try:
            dc = build.capture_ref(ref, dtype="float32", rounding=acts)
        except UsageError:
            raise
        except Exception as e:
            dc = _error(e)
        build.timings["capture_hf_ggml_drift"] = time.perf_counter() - t
        # where the drift run cannot round as llama.cpp does (a matmul outside nn.Linear), the
        # drift from that layer on understates llama.cpp's: the judge keeps the table's bound
        # there too (Judge.compare_refs)
        left = unrounded_params(model, build.hf_types, acts)
        where = [int(m.group(1)) for n in left
                 if (m := re.match(re.escape(build.family.layers_path) + r"\.(\d+)\.", n))]
        n_layers = len(build.layer_cfgs)
        dc.meta["unrounded"] = left[:8]
        dc.meta["unrounded_from_layer"] = (min(where) if where else n_layers) if left else None
        return dc

    return build.memo("ggml_drift", make)


def own_rounding(build, cand: RefCapture, ref: RefCapture) -> RefCapture | None:
    """The drift that bounds two float32 runs of one model against each other where
    the policy asks for it (a ``drift_ratio`` in the pair's float32 tolerance:
    fixtures/tolerance.toml, gemma3n's hf_cached vs hf): the oracle reference
    free-running in float64 (``free``), whose distance to ``ref``, probe by probe
    and layer by layer, is ``ref``'s own float32 rounding grown by the layers in
    front of the probe -- at THIS depth, width and length. ``cand`` is another
    float32 computation of the same model (HF's cached path: other shapes, other
    summation orders), so its distance to ``ref`` is of the same size: a constant
    fitted at one depth is not (gemma3n's two HF paths: NMSE 7.6e-9 at 21 layers
    and 64 tokens, 2.9e-7 at 35 layers, hidden 256, 512 tokens). None where the
    policy does not ask for it, or there is nothing to measure (another dtype, a
    reference that is not the oracle one, the oracle skipped by the memory plan)."""
    spec = references.get(ref.name)
    if not (spec.oracle and ref.dtype == "float32" and cand.dtype == "float32") or build.plan.skips_oracle:
        return None
    base, _ = build.policy.tolerance("float32", "layer_out", build.family.name, ref.name, cand.name)
    if "drift_ratio" not in base:
        return None
    oc = free(build)
    if oc is not None and not oc.error:
        oc.meta.setdefault("drift_what", f"{ref.name}'s own float32 rounding (its free-running float64 run)")
    return oc


def rounding_for(build, rc: RefCapture, teacher_forced: bool) -> RefCapture | None:
    """The float64 run that measures a reference's OWN rounding where the candidate
    computes in float64 and the reference cannot (llama.cpp's float32 graph): the
    oracle reference (HF) in float64 on ``rc``'s weights, each decoder layer fed
    ``rc``'s own input to it. The candidate is then judged against ``rc`` directly
    (its bound, its findings) AND must be at most ``ratio`` times as far from this
    run as ``rc`` itself is (``Judge.judge``): a float64 candidate against llama.cpp
    alone was held to float32's bound only, and a norm's epsilon outside the square
    root passed it (issue 28: NMSE 8.6e-11 under 1e-10) while llama.cpp's own
    rounding at that probe was ~1e-15. A correct float64 candidate is ~1e-30 from
    this run on any CPU, so the check cannot raise a false alarm where llama.cpp
    rounds less on some machine; where the references compute different models (a
    finding) llama.cpp's distance is large and the allowance stops at the dtype's
    own bound, no weaker than before. None where it does not apply (an oracle
    reference, a candidate below float64 or running free, no oracle installed, the
    memory plan without an oracle)."""
    ref = references.get(rc.name)
    o = references.oracle_reference()
    # a reference computing the oracle's model in half precision (Reference.forced_oracle:
    # mlx-lm's bfloat16): the same second check, on its weights as it holds them -- the
    # dtype's flat table alone (NMSE 1e-2) let a dropped residual multiplier pass against it
    half = ref.forced_oracle and rc.dtype in ("bfloat16", "float16") and build.case.dtype == rc.dtype
    if (ref.oracle or not teacher_forced or (build.case.dtype != "float64" and not half) or rc.dtype == "float64"
            or o is None or build.plan.skips_oracle):
        return None

    def make():
        t = time.perf_counter()
        try:
            oc = build.capture_ref(o, dtype="float64", weights=rc.dtype if half else "float32", force=rc)
        except UsageError:
            raise
        except Exception as e:
            oc = _error(e)
        build.timings[f"capture_{o.name}_rounding_of_{rc.name}"] = time.perf_counter() - t
        return oc

    return build.memo(f"rounding_of_{rc.name}", make)
