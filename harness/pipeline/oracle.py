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
import traceback
import re

import numpy as np

from .. import references
from ..errors import UsageError
from ..references import RefCapture
from harness.lazy import lazy
from .. import runlog
from ..ggml_types import is_quantized
from ..references.llamacpp.ggml_matmul import linear_act_types, unrounded_params
from ..policy import comparison_dtype
from ..schedule import chunk_sizes
from contract.probes import STATE_PROBES

torch = lazy("torch")


def _error(e: Exception) -> RefCapture:
    ref = references.oracle_reference()

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


def free(build, weights: str | None = None) -> RefCapture:
    """The oracle reference in float64, free-running from the case's tokens on the
    weights the case's own run of it holds -- or, ``weights="float32"``, on the
    float model's own (made once per case and weights)."""
    w = weights or (build.case.dtype if build.case.dtype in ("float16", "bfloat16") else "float32")

    def make():
        t = time.perf_counter()
        try:
            oc = build.capture_ref(references.oracle_reference(), dtype="float64", weights=w)
        except UsageError:
            raise
        except Exception as e:
            oc = _error(e)
        # summed with the forced oracles: own_rounding may run this beside them in one case
        build.timings["capture_hf_oracle"] = build.timings.get("capture_hf_oracle", 0.0) + time.perf_counter() - t
        return oc

    w_case = build.case.dtype if build.case.dtype in ("float16", "bfloat16") else "float32"
    return build.memo("free_oracle" if w == w_case else f"free_oracle_{w}", make)


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


def own_rounding(build, cand: RefCapture, ref: RefCapture, caps=()) -> tuple[RefCapture | None, RefCapture | None]:
    """``(drift, base)``: the drift that bounds two float runs of one model against
    each other where the policy asks for it (a ``drift_ratio`` in the pair's
    comparison-dtype tolerance, fixtures/tolerance.toml), and the capture it is
    measured against (None: ``ref`` itself). The drift is the oracle reference
    free-running in float64 (``free``) on the case's weights.

    - Two float32 runs (gemma3n's hf_cached vs hf): the drift's distance to ``ref``,
      probe by probe and layer by layer, is ``ref``'s own float32 rounding grown by
      the layers in front of the probe -- at THIS depth, width and length. ``cand``
      is another float32 computation of the same model (HF's cached path: other
      shapes, other summation orders), so its distance to ``ref`` is of the same size:
      a constant fitted at one depth is not (gemma3n's two HF paths: NMSE 7.6e-9 at
      21 layers and 64 tokens, 2.9e-7 at 35 layers, hidden 256, 512 tokens).
    - A half-precision case (bfloat16 / float16: HF computes in it, llama.cpp in
      float32 on the same weights, mlx-lm in it): the pair's distance is the
      half-precision side's own rounding carried free-running through the layers,
      which a flat NMSE does not bound -- behind a recurrent layer's gated output
      norm a row whose input is near zero is rescaled to unit size with its relative
      error (qwen3_next bfloat16, 33 tokens: llama.cpp vs HF L2 attn_branch NMSE
      0.018 against the table's 0.01, every impl row passing). The drift is then
      measured against the oracle reference's own run at the case's dtype (``base``):
      HF's half-precision distance to its float64 self at this probe.

    ``(None, None)`` where the policy does not ask for it, or there is nothing to
    measure (other dtypes, no oracle reference run among ``caps``, the oracle
    skipped by the memory plan)."""

    spec = references.get(ref.name)
    if build.plan.skips_oracle or references.oracle_reference() is None:
        return None, None
    half = build.case.dtype in ("bfloat16", "float16")
    if half:
        cdt = comparison_dtype(cand.dtype, ref.dtype)
        oracle_ref = references.oracle_reference().name
        base = next((c for c in caps if c.name == oracle_ref and c.dtype == build.case.dtype and not c.error), None)
        # quantized weights: the pair is judged at ggml's activation type, a rounding this
        # drift does not hold (``drift`` measures that one, at a float32 case)
        if cdt != build.case.dtype or base is None or is_quantized(build.case.gguf_type):
            return None, None
    elif spec.oracle and ref.dtype == "float32" and cand.dtype == "float32":
        cdt, base = "float32", None
    else:
        return None, None
    tol, _ = build.policy.tolerance(cdt, "layer_out", build.family.name, ref.name, cand.name)
    if "drift_ratio" not in tol:
        return None, None
    # half: on the float model's weights -- llama.cpp's export holds them unrounded, so the
    # half side's distance from them is its weights' rounding AND its arithmetic's
    oc = free(build, "float32")
    if oc is not None and not oc.error:
        what = (f"{base.name}'s own {cdt} rounding, weights and arithmetic (the float model's free-running "
                "float64 run)" if half else
                f"{ref.name}'s own float32 rounding (its free-running float64 run)")
        oc.meta.setdefault("drift_what", what)
    return oc, (None if base is ref else base)


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
    # a half-precision candidate against a float32 reference (llama.cpp's graph on float weights),
    # or a float32 one against it alone: the float64 run on the weights the candidate holds (its
    # dtype's), sized by ``dtype_sizer``
    below = sized_candidate(build, rc)
    if (ref.oracle or not teacher_forced or (build.case.dtype != "float64" and not half and not below)
            or rc.dtype == "float64" or o is None or build.plan.skips_oracle):
        return None
    # below: on the weights and the layer inputs as the candidate holds them (rounded to the
    # case's dtype), so that its distance and the sizer's (``dtype_sizer``) are the arithmetic's
    # alone, as against HF; on HF's cached path where llama.cpp names the recurrent state
    # (``_state_oracle``). Whether that run computes llama.cpp's model is ``model_guard``'s
    weights = rc.dtype if half else build.case.dtype if below else "float32"
    force = rc
    if below:
        o = _state_oracle(build, rc) or o
        force = _rounded_inputs(rc, build.case.dtype) if build.case.dtype != rc.dtype else rc

    return build.memo(f"rounding_of_{rc.name}", lambda: _timed(
        build, f"capture_{o.name}_rounding_of_{rc.name}", o, dtype="float64", weights=weights, force=force))


def sized_candidate(build, rc: RefCapture) -> bool:
    """A candidate judged against a float32 reference that is not the oracle one, on float
    weights (llama.cpp's graph), whose bound is sized as against HF (``dtype_sizer``):

    - at bfloat16 / float16: the flat table (NMSE 1e-2 at bfloat16) was all that judged
      it, and a recurrent state kept in bfloat16 moved qwen3_next's state_rec against
      llama.cpp alone from 3.5e-5 to 8.0e-5, 125x under it (issue 40);
    - at float32, where llama.cpp is the case's only float reference (the oracle
      reference not among the case's: with it, HF's own rule already judges the
      candidate at every probe): the flat 1e-10 was all, where HF's rule allows ~4e-13 at
      the tiny sizes -- lightning's decay residual lost between one-row calls passed it
      at 0.058 of it (docs/measurements/2026-12-07-float32-llamacpp-alone.md)."""

    ref = references.get(rc.name)
    if ref.oracle or ref.forced_oracle or rc.dtype != "float32" or is_quantized(build.case.gguf_type):
        return False
    if build.case.dtype in ("bfloat16", "float16"):
        return True
    o = references.oracle_reference()
    return build.case.dtype == "float32" and o is not None and o.name not in build.case.refs


def dtype_sizer(build, rc: RefCapture, teacher_forced: bool) -> RefCapture | None:
    """What a sound computation of the layer in the case's dtype is off the float64 run on
    ``rc``'s layer inputs (``rounding_for``): the oracle reference (HF) itself in the
    case's dtype, on the same weights, each decoder layer fed ``rc``'s own input. The
    candidate, fed those same inputs, is then held to ``ratio`` times that distance --
    the oracle rule against HF, on llama.cpp's inputs: the reference it is judged
    against computes in float32 (its own distance says nothing of a half-precision
    candidate's precision), and the flat table is 100x (bfloat16) to 250x (float32, the
    tiny sizes) looser than HF's rule. None where
    ``sized_candidate`` does not hold (or no oracle reference, a free-running candidate,
    the memory plan without an oracle)."""
    dt = build.case.dtype
    force = (lambda: _rounded_inputs(rc, dt)) if dt != rc.dtype else (lambda: rc)
    sizer = _on_inputs(build, rc, teacher_forced, "sizer", dt, dt, force)
    if sizer is None or sizer.error or dt != "float32" or sizer.name == references.oracle_reference().name:
        return sizer
    # float32 where llama.cpp names a recurrent state (the sizer is then HF's cached path, for
    # the state): what leaves the layer is sized by HF's full forward, as against HF. The
    # cached path rounds lightning's per-call decay fl(exp(-slope)) afresh every call, as
    # llama.cpp does (minimax-01.cpp), a rounding that accumulates over one-row calls (NMSE
    # 4e-12 at 256 calls); HF's full forward decays by exact row counts (modeling_minimax.py
    # decay_factors) -- sized by the cached path, a candidate that drops the correction
    # (mutant lightning-decay-residual-dropped) passed at 0.26 of its bound. The states keep
    # the cached path's sizing (only it exposes them). Half precision keeps the cached path
    # throughout: its state storage is what that rule sizes, measured so (2026-12-07-half-precision.md).
    full = _on_inputs(build, rc, teacher_forced, "full_sizer", dt, dt, force, state=False)
    if full is None or full.error:
        return full
    states = {k: v for k, v in sizer.probes.items() if _is_state(k)}
    return RefCapture(full.name, dt, {**full.probes, **states}, meta=dict(full.meta, states_from=sizer.name),
                      key=f"{full.key}|{sizer.key}")


def model_guard(build, rc: RefCapture, teacher_forced: bool) -> RefCapture | None:
    """The float64 run that says whether the sizing rule applies: the same reference on
    ``rc``'s own layer inputs and on the weights llama.cpp holds (its export's float
    type), so that it computes llama.cpp's model -- the judge applies the rule only
    where ``rc`` (float32) is within float32's bound of it; where the two references'
    models differ (a finding, HF's cached path's own divergence) the table's bound
    alone stands, as before. None where ``dtype_sizer`` is. Where the candidate's weights
    are the file's (a float32 case on an F32 export) and its inputs llama.cpp's own, that
    run is ``rounding_for``'s: made once."""
    if _file_float(build) == build.case.dtype == rc.dtype and sized_candidate(build, rc):
        return rounding_for(build, rc, teacher_forced)
    return _on_inputs(build, rc, teacher_forced, "guard", "float64", _file_float(build), lambda: rc)


def _on_inputs(build, rc, teacher_forced, what, dtype, weights, force, state=True) -> RefCapture | None:
    """The oracle reference (its cached path where ``rc`` names a recurrent state, and
    ``state``) in ``dtype`` on ``weights``, each decoder layer fed ``force()``'s layer
    inputs; made once per case (``what``); an error comes back as a capture with
    ``error`` set."""
    o = references.oracle_reference()
    if not (teacher_forced and sized_candidate(build, rc)) or o is None or build.plan.skips_oracle:
        return None
    o = (_state_oracle(build, rc) if state else None) or o

    return build.memo(f"{what}_of_{rc.name}", lambda: _timed(
        build, f"capture_{o.name}_{what}_of_{rc.name}", o, dtype=dtype, weights=weights, force=force()))


def _timed(build, timing: str, ref, **kw) -> RefCapture:
    """``ref``'s capture with ``kw``, its time recorded under ``timing``; an error comes
    back as a capture with ``error`` set (the comparison then errors, the run goes on)."""
    t = time.perf_counter()
    try:
        oc = build.capture_ref(ref, **kw)
    except UsageError:
        raise
    except Exception as e:
        oc = _error(e)
    build.timings[timing] = time.perf_counter() - t
    return oc


def _rounded_inputs(rc: RefCapture, dtype: str) -> RefCapture:
    """``rc`` as a capture to force by, its layer inputs rounded to ``dtype`` as the
    candidate is handed them (a half-precision candidate fed llama.cpp's float32 layer
    inputs casts them, round to nearest even)."""

    class Rounded(dict):
        def __missing__(self, k):  # lazily: only the layer inputs are read
            v = torch.as_tensor(np.array(rc.probes[k])).to(getattr(torch, dtype)).to(torch.float32).numpy()
            self[k] = v
            return v

        def __iter__(self):
            return (k for k in rc.probes if k.endswith(".layer_in"))

        def __contains__(self, k):
            return k.endswith(".layer_in") and k in rc.probes

    return RefCapture(rc.name, dtype, Rounded(), meta=rc.meta, key=f"{rc.key}|inputs-{dtype}")


def _file_float(build) -> str:
    """The float type of the weights llama.cpp holds: its export's (F32, F16, BF16), by the
    policy's own names for them (``sized_candidate`` holds: never a quantized type)."""

    return comparison_dtype(build.case.gguf_type, "float32")


def _state_oracle(build, rc: RefCapture):
    """HF's cached path (``hf_cached``) where ``rc`` names a recurrent state and that
    path runs the case's schedule: its run on ``rc``'s layer inputs carries the state
    call by call, as llama.cpp's does, and exposes it -- so the state probes are judged
    by the rule too, not only what leaves the layer. None: HF's full forward."""
    if not any(map(_is_state, rc.probes)):
        return None
    try:
        cached = references.get("hf_cached")
    except Exception:  # not installed as a plug-in
        return None
    return None if "hf_cached" in build.schedule_refusals or cached.schedule_refusal(
        build.family, build.config, _chunks(build)) else cached


def _chunks(build) -> tuple:
    return tuple(chunk_sizes(build.case.schedule, build.case.tokens))


def _is_state(key: str) -> bool:
    """Whether capture key ``key`` (``L{i}.{probe}``) is a recurrent state probe."""
    return key.split(".", 1)[-1] in STATE_PROBES
