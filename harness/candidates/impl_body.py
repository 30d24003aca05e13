"""Candidates that run impl's own body: ``impl`` itself (the default), and
``torch-sdpa-kernel`` -- impl with its attention kernel swapped for
``torch.nn.functional.scaled_dot_product_attention``, what an engine author
does first, and what that swap silently breaks."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np

from .api import LayerCall, LayerCandidate, NotExposed
from harness.lazy import lazy
from impl.trace import Trace
from ..mutants import _rebind
import impl.attention
import impl.runner
from impl import Backend
from impl.runner import load_layer
from harness.references.llamacpp.ggml_matmul import installed, weight_names
from .. import families
from ..errors import UsageError
from impl.runner import run_layer

torch = lazy("torch")


class ImplCandidate(LayerCandidate):
    description = "impl/: the implementation under test (the default candidate)"
    runs_modules = ("impl",)
    ragged = True  # impl.runner takes each sequence's chunks and arrival (LayerCall.steps)
    reads_kv_source = True  # impl.runner.run_layer(source=...): LayerCall.source
    warm_path = True  # run_layer reads its LayerCall alone (harness/warm.py)

    def backend(self, call: LayerCall):
        return Backend(call.backend, call.device, call.dtype)

    def run_layer(self, call: LayerCall) -> dict:
        layer = load_layer(call.config, call.weights, self.backend(call))
        # a layer reading another layer's K/V (kv_source): the source runs beside it, its
        # own products rounded as the reader's are (its LayerCall's ggml_act)
        src = call.source
        src_layer = None if src is None else load_layer(src.config, src.weights, self.backend(call))
        src_act = {} if src is None else src.ggml_act
        # against llama.cpp on quantized weights, the projections' inputs rounded as ggml's
        # CPU quantizes activations (LayerCall.ggml_act; impl's code is not changed), in the
        # order the file holds each weight's input columns (Family.ggml_input_orders)
        orders, src_orders = {}, {}
        if call.ggml_act or src_act:
            fam = families.get(call.family)
            orders = fam.ggml_input_orders(call.config)
            src_orders = {} if src is None else fam.ggml_input_orders(src.config)
        with installed(layer, call.ggml_act, orders) as met, \
                installed(src_layer, src_act, src_orders) if src is not None else nullcontext(set()) as src_met:
            # the case's schedule (harness/schedule.py): each sequence's chunks and the call it
            # joins at -- the same chunks for all in a lockstep case
            n = len(call.inputs)
            _, traces, _ = run_layer(layer, call.inputs, call.kv, [list(call.seq_chunks(s)) for s in range(n)],
                                     page_size=call.page_size, seed=call.seed, evict=call.evict,
                                     arrivals=[call.arrival(s) for s in range(n)],
                                     source=None if src is None else (src_layer, src.inputs))
        # a weight the layer's form makes no product with (the absorbed MLA's wkv_b) has
        # nothing to round; a reader's rounding is whole only where its source's was too
        src_whole = src is None or set(src_act) <= src_met | (set(src_act) - weight_names(src_layer))
        if src_whole:
            call.ggml_met.update(met | (set(call.ggml_act) - weight_names(layer)))
        per_seq = [t.assemble() for t in traces]
        if len({len(x) for x in call.inputs}) > 1:  # ragged: one array per sequence, each its own length
            return {probe: [p[probe] for p in per_seq] for probe in per_seq[0]}
        return {probe: np.stack([p[probe] for p in per_seq]) for probe in per_seq[0]}


# ---------------------------------------------------------------- torch-sdpa-kernel
KERNEL = "impl.attention.attend"
# what the swapped kernel drops, by the keyword of impl's kernel that carries it:
# SDPA takes q, k, v, a mask, a scale and GQA -- none of these
DROPPED = {"window": "sliding / chunked windows", "softcap": "softcap", "sinks": "sinks", "slopes": "ALiBi"}


def sdpa_attend(be, q, k, v, q_pos, k_pos, *, scale, head_map, window=None, softcap=None, sinks=None,
                slopes=None, want_probs=True):
    """impl's kernel signature (``impl.attention.attend``) over
    ``torch.nn.functional.scaled_dot_product_attention``, the way an engine
    author swaps it in: the causal mask from the positions (a decode row sees
    every cached key; ``is_causal`` would align the mask top-left), the scale,
    GQA by gathering each query head's KV head. ``window``, ``softcap``,
    ``sinks`` and ``slopes`` (ALiBi) have no SDPA parameter and are dropped --
    silently, as such a swap does; the harness is what notices. SDPA returns no
    probabilities, so ``attn_probs`` is not exposed."""

    xp = be.xp
    hm = be.index(head_map)
    kh = xp.permute_dims(xp.take(k, hm, axis=1), (1, 0, 2))  # [H, L, D]
    vh = xp.permute_dims(xp.take(v, hm, axis=1), (1, 0, 2))  # [H, L, Dv]
    qh = xp.permute_dims(q, (1, 0, 2))  # [H, n, D]
    visible = be.mask(k_pos[None, :] <= q_pos[:, None])
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=scale)
    return xp.permute_dims(out, (1, 0, 2)), None


@contextmanager
def swapped_kernel():
    """impl's attention kernel replaced by ``sdpa_attend`` wherever it is bound by
    name (impl.attention, impl.mla, impl) for the duration of the block; the
    trace tolerates the missing probabilities. impl's files are not touched."""
    class _NoProbsTrace(Trace):
        def put_probs(self, probs, q_pos, k_pos):
            if probs is not None:
                super().put_probs(probs, q_pos, k_pos)

    original = impl.attention.attend
    rebound = _rebind(original, sdpa_attend)
    impl.runner.Trace = _NoProbsTrace
    try:
        yield
    finally:
        impl.runner.Trace = Trace
        for mod, attr in rebound:
            setattr(mod, attr, original)


class TorchSdpaKernel(ImplCandidate):
    description = ("impl's body with impl.attention.attend swapped for torch's scaled_dot_product_attention "
                   "(windows, softcap, sinks and ALiBi dropped: SDPA has no parameter for them)")
    replaces = (KERNEL,)

    def validate(self, case) -> None:
        if case.backend != "torch":
            raise UsageError(f"candidate {self.name} calls torch's scaled_dot_product_attention on impl's torch "
                             "backend; use --backend torch")

    def mutant_case_fields(self) -> dict:
        return {"backend": "torch"}

    def run_layer(self, call: LayerCall) -> dict:
        with swapped_kernel():
            out = super().run_layer(call)
        out["attn_probs"] = NotExposed("scaled_dot_product_attention returns no probabilities")
        return out
