"""The candidate API: what an engine is handed for one layer and what it returns.

An outside engine depends on this module only (and on ``contract.layers`` for
the descriptions it is handed, ``contract.probes`` for the names it returns).
The harness's ``Candidate`` / ``LayerCandidate`` base classes and their registry
(``harness/candidates``) are built on these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .probes import PROBES

# The canonical layout of each layer probe a candidate returns, generated from the
# probe vocabulary (``S`` sequences, ``T`` tokens, ``H`` query heads, ``Hkv`` KV heads,
# ``D`` head_dim, ``Dv`` v_head_dim; MLA: nope / rope / r = kv_lora_rank)
PROBE_SHAPES = {p.name: f"{p.shape}  {p.doc}" for p in PROBES.values() if p.scope == "layer" and p.name != "layer_in"}


@dataclass(frozen=True)
class NotExposed:
    """A probe the candidate cannot expose, and why (reported ``not-exposed``)."""

    reason: str


@dataclass(frozen=True)
class LayerCall:
    """Everything a ``LayerCandidate`` is given for one decoder layer -- the same
    data impl receives.

    ``inputs``: one ``[tokens, hidden]`` float64 array per sequence, the
    reference's own input to this layer. ``chunks``: rows per call (the
    schedule; ``sum(chunks) == tokens``), the same for every sequence.
    ``kv``: ``decode`` (each sequence alone, start to end), ``batched`` (the
    sequences advance together, one call of each per step) or ``paged`` (as
    batched, over one shared page pool of ``page_size`` rows a page);
    ``evict``: a contiguous cache drops the rows a windowed layer can no longer
    read. ``dtype``: the precision to compute in; ``backend`` / ``device``:
    impl's array backend (a candidate may ignore them).

    ``steps``: the batch's calls in order, each a tuple of ``(sequence, rows)``
    -- which sequences advance in that call and by how many rows. In a ragged
    case (``--ragged``: continuous batching) the sequences differ in length
    (``len(inputs[s])``), first-call size and arrival, so no single ``chunks``
    describes them: there ``chunks`` is ``()`` and only a candidate that reads
    ``steps`` (``seq_chunks`` / ``arrival``; the harness's ``Candidate.ragged``)
    is given the case. Empty (a ``LayerCall`` made without it): every sequence
    runs ``chunks``, all from the first call. A ragged candidate may return
    each probe as one array per sequence (its own length) instead of one
    stacked array.

    ``ggml_act`` (against llama.cpp on quantized weights only, else empty): impl
    weight name -> the type ggml's CPU quantizes the activations multiplied by
    that weight to (harness/refs/ggml_matmul.py). A candidate that rounds those
    activations the same way adds to ``ggml_met`` the names of the weights it did
    so for, and of those it makes no product with (a form of the layer that does
    not use them: the absorbed MLA's ``wkv_b``); the layer is then judged at
    ``ggml_<act>`` (only summation order left), else at the activation type's
    own, wider bound. Optional: a candidate that ignores both is judged at the
    wider bound.

    ``source``: for a layer that reads another layer's K/V (``config.kv_source``, gemma3n's
    last layers), the ``LayerCall`` of that source layer -- its description, weights and the
    SAME reference's input to it -- so the candidate runs the source beside this layer and
    attends over the source's cache (impl: ``impl.runner.run_layer(source=...)``); None
    elsewhere."""

    layer: int
    config: object  # a contract.layers description: LayerConfig | MlaConfig | ...
    weights: dict
    inputs: list
    kv: str
    chunks: tuple
    page_size: int
    seed: int
    evict: bool
    backend: str
    device: str
    dtype: str
    family: str
    ggml_act: dict = field(default_factory=dict)
    ggml_met: set = field(default_factory=set, compare=False)
    steps: tuple = ()
    source: "LayerCall | None" = None

    def calls(self) -> tuple:
        """``steps``, or the lockstep plan ``chunks`` describes where it is empty."""
        if self.steps:
            return self.steps
        n = len(self.inputs)
        if self.kv == "decode":
            return tuple(((s, c),) for s in range(n) for c in self.chunks)
        return tuple(tuple((s, c) for s in range(n)) for c in self.chunks)

    def seq_chunks(self, s: int) -> tuple[int, ...]:
        """The rows of each call of sequence ``s``, in order."""
        return tuple(n for call in self.calls() for seq, n in call if seq == s)

    def arrival(self, s: int) -> int:
        """The call at which sequence ``s`` joins (0 for all in a lockstep case; a
        decode case runs each sequence alone, so its calls count per sequence)."""
        if self.kv == "decode":
            return 0
        return next(k for k, call in enumerate(self.calls()) if any(seq == s for seq, _ in call))


@dataclass
class CandidateCapture:
    """What a candidate returned for one reference's inputs.

    ``probes``: ``{"L{layer}.{probe}": array [S, ...]}`` (and, for a free-running
    candidate, ``embeddings`` / ``final_norm`` / ``logits``); ``not_exposed``:
    ``{key or probe name: reason}`` (a bare probe name covers every layer);
    ``errors``: ``{layer: message}`` (a layer that raised; ``details``: its full
traceback); ``dtype``: the
    precision it computed in (the comparison is made at the coarser of it and
    the reference's); ``note``: said with the run when that precision is not
    the case's, with the engine's source line."""

    name: str
    dtype: str
    probes: dict = field(default_factory=dict)
    not_exposed: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # layer -> the full traceback behind errors[layer]
    meta: dict = field(default_factory=dict)
    note: str = ""  # how it is judged, where that is not plain (a precision coarser than the case's)
    # layer -> the comparison precision of that layer where it is not ``dtype``'s (against
    # llama.cpp on quantized weights: ggml_<act> or the activation type, LayerCall.ggml_act)
    layer_dtypes: dict = field(default_factory=dict)

    def hidden(self, key: str) -> str | None:
        """Why ``key`` ("L3.attn_probs") is not exposed, or None."""
        return self.not_exposed.get(key) or self.not_exposed.get(key.split(".", 1)[-1])
