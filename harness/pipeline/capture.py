"""The capture stage: each reference's probes for the case.

A reference is captured from the case's frozen ``CaptureRequest``
(harness/references); a crash inside it is a recorded error capture -- an
error row, and the run goes on. Where a reference derived a probe its graph
does not name (llama.cpp's ``attn_out`` as ``ffn_inp - layer_in``), the
capture says how, and every row compared on it says so too.
"""

from __future__ import annotations

import time
import traceback

from .. import references, runlog
from ..errors import UsageError
from ..references import RefCapture


def capture(build, name: str, derived: dict | None = None) -> RefCapture:
    """Reference ``name``'s capture of ``build``'s case (cached, content-addressed);
    ``derived`` receives ``{(reference, probe key): how it was derived}``."""
    ref = references.get(name)
    t = time.perf_counter()
    try:
        rc = build.capture_ref(ref)  # the recorded capture on the warm path (harness/warm.py)
    except UsageError:
        raise
    except references.NotImplementedHere as e:  # found on building its model: a refusal, not a crash
        rc = RefCapture(name, ref.compute_dtype(build.case.dtype), error=str(e), meta={"not_implemented": str(e)})
    except Exception as e:  # a crash inside a reference is a recorded error row
        tb = traceback.format_exc()
        runlog.traceback_block(f"{build.case.case_id()}: reference {name}", tb)
        rc = RefCapture(name, ref.compute_dtype(build.case.dtype),
                        error=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}", meta={"traceback": tb})
    rc.seconds = time.perf_counter() - t
    build.timings[f"capture_{name}"] = rc.seconds
    if derived is not None:
        derived.update({(name, k): how for k, how in (rc.meta.get("derived") or {}).items()})
    return rc
