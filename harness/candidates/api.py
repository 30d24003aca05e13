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
can expose by our names (``impl.trace.LAYER_PROBES``; shapes in
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
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import UsageError, suggest

GROUP = "attn_conformance.candidates"
DEFAULT = "impl"
# names that are references, never candidates: a row's candidate column must say
# which side was checked
RESERVED = ("hf", "llamacpp", "-")

# The canonical layout of each probe a candidate returns (``S`` sequences, ``T``
# tokens, ``H`` query heads, ``Hkv`` KV heads, ``D`` head_dim, ``Dv`` v_head_dim):
PROBE_SHAPES = {
    "attn_in": "[S, T, hidden]  the input norm's output",
    "q": "[S, T, H, D]  after projection and bias, before norms and RoPE",
    "k": "[S, T, Hkv, D]",
    "v": "[S, T, Hkv, Dv]",
    "q_rope": "[S, T, H, D]  what enters the score product (after RoPE, post-RoPE norm, temperature)",
    "k_rope": "[S, T, Hkv, D]",
    "attn_probs": "[S, H, T, T]  softmax over keys (query rows, key columns; zero where masked)",
    "attn_heads": "[S, T, H, Dv]  softmax(QK)V per head, before any gate",
    "attn_branch": "[S, T, H * Dv]  what enters wo (after gates and sub-norm)",
    "attn_out": "[S, T, hidden]  what is added to the residual (after wo, its scale and bias, post-norm)",
    "resid_mid": "[S, T, hidden]  the residual after the attention half",
}


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
    schedule; ``sum(chunks) == tokens``). ``kv``: ``decode`` (each sequence
    alone, start to end), ``batched`` (the sequences advance together, one call
    of each per step) or ``paged`` (as batched, over one shared page pool of
    ``page_size`` rows a page); ``evict``: a contiguous cache drops the rows a
    windowed layer can no longer read. ``dtype``: the precision to compute in;
    ``backend`` / ``device``: impl's array backend (a candidate may ignore them).

    ``ggml_act`` (against llama.cpp on quantized weights only, else empty): impl
    weight name -> the type ggml's CPU quantizes the activations multiplied by
    that weight to (harness/refs/ggml_matmul.py). A candidate that rounds those
    activations the same way adds to ``ggml_met`` the names of the weights it did
    so for, and of those it makes no product with (a form of the layer that does
    not use them: the absorbed MLA's ``wkv_b``); the layer is then judged at
    ``ggml_<act>`` (only summation order left), else at the activation type's
    own, wider bound. Optional: a candidate that ignores both is judged at the
    wider bound."""

    layer: int
    config: object  # impl.LayerConfig | impl.MlaConfig
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


@dataclass
class CandidateCapture:
    """What a candidate returned for one reference's inputs.

    ``probes``: ``{"L{layer}.{probe}": array [S, ...]}`` (and, for a free-running
    candidate, ``embeddings`` / ``final_norm`` / ``logits``); ``not_exposed``:
    ``{key or probe name: reason}`` (a bare probe name covers every layer);
    ``errors``: ``{layer: message}`` (a layer that raised); ``dtype``: the
    precision it computed in (the comparison is made at the coarser of it and
    the reference's); ``note``: said with the run when that precision is not
    the case's, with the engine's source line."""

    name: str
    dtype: str
    probes: dict = field(default_factory=dict)
    not_exposed: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    note: str = ""  # how it is judged, where that is not plain (a precision coarser than the case's)
    # layer -> the comparison precision of that layer where it is not ``dtype``'s (against
    # llama.cpp on quantized weights: ggml_<act> or the activation type, LayerCall.ggml_act)
    layer_dtypes: dict = field(default_factory=dict)

    def hidden(self, key: str) -> str | None:
        """Why ``key`` ("L3.attn_probs") is not exposed, or None."""
        return self.not_exposed.get(key) or self.not_exposed.get(key.split(".", 1)[-1])


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
    ``run_layer``. Layers the harness has no description for (``NotInImpl``:
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
        for a layer with no description (``NotInImpl``) or no input in ``rc``."""
        from ..families.base import NotInImpl
        from ..schedule import chunk_sizes

        case = run.case
        cap = CandidateCapture(self.name, self.dtype(run))
        lc = run.layer_cfgs[i]
        key = f"L{i}.layer_in"
        if isinstance(lc, NotInImpl) or key not in rc.probes:
            return cap
        try:
            x = rc.probes[key]
            inputs = [np.asarray(x[s]) for s in range(x.shape[0])]
            call = LayerCall(i, lc, run.layer_weights_for(run.weights_dtype(rc), i), inputs, case.kv,
                             tuple(chunk_sizes(case.schedule, x.shape[1])), case.page_size, case.seed, case.evict,
                             case.backend, case.device, case.dtype, run.family.name, run.ggml_act_types(rc, i))
            got = self.run_layer(call)
        except Exception as e:  # the candidate crashed: an error row for this layer, the run goes on
            cap.errors[i] = f"{self.name} raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            return cap
        ldt = run.ggml_layer_dtype(rc, call)  # after run_layer: it reads what the candidate met (call.ggml_met)
        if ldt:
            cap.layer_dtypes[i] = ldt
        for probe, arr in got.items():
            if isinstance(arr, NotExposed):
                cap.not_exposed[f"L{i}.{probe}"] = arr.reason
            elif run.selection.probe(probe):
                cap.probes[f"L{i}.{probe}"] = np.asarray(arr)
        return cap


# ---------------------------------------------------------------- the registry
def _entry_points() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _declared_here() -> dict[str, str]:
    """This project's own built-ins as its pyproject.toml declares them. Read
    besides the installed metadata so a checkout whose editable install predates
    a new built-in still finds it (the same declaration, one place)."""
    import tomllib

    p = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return dict(data.get("project", {}).get("entry-points", {}).get(GROUP, {}))


class _Declared:
    """An entry point read from pyproject.toml: ``module:attr``."""

    def __init__(self, name: str, value: str):
        self.name, self.value = name, value

    def load(self):
        import importlib

        mod, _, attr = self.value.partition(":")
        obj = importlib.import_module(mod)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj


@lru_cache(maxsize=1)
def registry() -> dict:
    """``{name: entry point}``: installed entry points of the group, and this
    project's own declared ones. A name may not be a reference's."""
    # this checkout's own declarations win over installed metadata for their names
    # (an editable install's metadata may be older); other packages add theirs
    found = _entry_points()
    found.update({n: _Declared(n, v) for n, v in _declared_here().items()})
    for n in RESERVED:
        found.pop(n, None)
    return dict(sorted(found.items()))


DUMP_PREFIX = "dump:"


def names() -> list[str]:
    return list(registry())


def get(name: str) -> Candidate:
    """The candidate called ``name`` (``dump:DIR``: a dump directory's engine)."""
    return _get(name)


@lru_cache(maxsize=64)
def _get(name: str) -> Candidate:
    if name.startswith(DUMP_PREFIX):
        from .dump import DumpCandidate

        return DumpCandidate(name[len(DUMP_PREFIX):])
    reg = registry()
    if name not in reg:
        raise UsageError(f"unknown candidate {name!r}; {suggest(name, list(reg) + ['dump:DIR'])}")
    try:
        obj = reg[name].load()
    except Exception as e:  # a plug-in that does not import is bad input, said in one line
        raise UsageError(f"candidate {name!r} ({getattr(reg[name], 'value', '?')}) failed to load: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    import copy

    # a class is instantiated; an instance (one parametrised engine under several
    # names) is copied, so each name keeps its own
    cand = obj() if isinstance(obj, type) else copy.copy(obj)
    if not isinstance(cand, Candidate):
        raise UsageError(f"candidate {name!r} is a {type(cand).__name__}, not a harness.candidates.Candidate")
    cand.name = name
    return cand
