"""The references: the implementations every candidate is judged against.

A reference is a plug-in (entry point group ``attn_conformance.references``;
the built-ins are ``hf`` and ``llamacpp``, one folder each under this package).
What used to be ``if ref == "hf"`` in a dozen modules is an attribute of the
reference here, so a third reference is one folder and one entry point:

- ``capture(run)`` -> ``RefCapture``: its probes for the case (``run`` is the
  case's model stage, ``harness.pipeline.build.Build``: config, layer
  descriptions, tokens, weights, the GGUF, the selection);
- ``oracle``: it can run itself in float64, teacher-forced on another capture's
  layer inputs -- the float64 oracle low-precision comparisons are judged
  through (HF);
- ``graph_dtype``: the precision it computes in whatever the case asks
  (llama.cpp's graph: float32), None: the case's own;
- ``file_weights``: it computes with the GGUF's weight type (llama.cpp), so a
  comparison with it is made at that type's precision and, for quantized
  weights, a candidate may reproduce its activation rounding;
- ``sees_modules``: feature switches that replace model modules are visible
  to it only (HF: the switched modules are its own);
- ``default_for_file``: ``--gguf`` alone compares against it (llama.cpp).

References never import impl or the families (import-linter holds it): a
family's hooks reach them as the ``run.family`` object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from .capture import RefCapture  # noqa: F401 (re-exported)
from .. import plugins
from ..errors import UsageError, suggest

GROUP = "references"


class NotImplementedHere(Exception):
    """Raised by a reference's capture when it finds, only on building the case's model,
    that it does not implement what the case's config asks (mlx-lm's gemma2 has no place for
    the attention biases attention_bias=True adds): the case records a ``not-implemented``
    row with the message, as for a refusal known from the config, never an error row."""


@dataclass(frozen=True)
class CaptureRequest:
    """What a reference is given to capture one case (made by the case's Build,
    ``harness/pipeline/build.py``): frozen, so a reference cannot change the case
    under another's feet. The heavy parts are callables, made when first asked:
    ``gguf()`` the file llama.cpp runs, ``model(weights)`` -> ``(HF model, how it
    was built)`` with its weights held in ``weights``. ``timings`` is where a
    reference records where its time went (meta.json)."""

    case: Any  # harness.case.Case
    family: Any  # harness.families.Family
    config: Any  # the HF config
    layer_cfgs: tuple  # contract.layers descriptions, one per decoder layer
    tokens: Any  # np.ndarray [seqs, tokens]
    selection: Any  # harness.select.Selection
    variant: str | None
    hf_dtype: str  # what the memory plan lets HF compute in
    weights_stamp: tuple  # what, beyond the config and seed, decides the weights
    checkpoint_stamp: Any  # --hf-model's files
    user_file: bool  # the GGUF is the user's (--gguf), not an export
    gguf: Callable[[], Any]
    model: Callable[[str], tuple]
    timings: dict
    family_base_sources: tuple = ()  # the family machinery's files (in the capture's cache key)
    batch_plan: Any = None  # harness.schedule.BatchPlan: each sequence's rows, chunks and arrival
    # bytes of float64 weight copies HF's float64 run may keep between the calls of its
    # cached path (references/hf/float64.py ``promoted``): memory the plan holds and the run does not use
    float64_keep: int = 0


class Reference(ABC):
    name: str = ""  # set from the entry point
    label: str = ""
    oracle: bool = False
    # it computes the oracle reference's model from the same checkpoint (mlx-lm): in half
    # precision a candidate judged against it must also be at most ``ratio`` times as far
    # from the oracle reference's float64 run on THIS reference's layer inputs as it is
    # (oracle.rounding_for) -- against mlx-lm's bfloat16 alone, the dtype's flat table
    # (NMSE 1e-2) let a dropped residual multiplier pass (mutate --ref mlx)
    forced_oracle: bool = False
    graph_dtype: str | None = None
    file_weights: bool = False
    sees_modules: bool = False
    default_for_file: bool = False
    # its capture computes in a process of its own (llama.cpp's worker): the case may run it
    # in a thread beside the in-process references (harness/case.py ``_capture_all``)
    runs_apart: bool = False
    # the reference whose MODEL this one computes another way (hf_cached: HF's), or None;
    # a finding naming that reference holds for this one too (harness/policy.py)
    model_of: str | None = None
    # the extra that installs it (pytest's `llamacpp` marker; README setup)
    requires: str = ""
    # whether ``--ref all`` includes it; a reference joins once every family it implements
    # has been judged against it (a pass, a finding with its lines, or a refusal): until
    # then it runs where it is named (``--ref mlx``, ``--ref hf,mlx``)
    in_all: bool = True

    def available(self) -> bool:
        """Whether this reference can run here (its package installed)."""
        return True

    @abstractmethod
    def capture(self, run, **kw) -> RefCapture:
        """The reference's probes for the case (``run``: the case's Build)."""
    def refusal(self, family, config) -> str | None:
        """Why this reference does not implement ``family`` on ``config`` at all (mlx-lm
        has no module for the model type), or None (default). Under ``--ref all`` the
        case runs the other references and says so in a ``not-implemented`` row; named
        alone (``--ref NAME``), it is refused in one line, exit 2."""
        return None

    def config_refusal(self, family, config) -> str | None:
        """Why this reference cannot hold ``config`` of ``family`` at all -- a setting its
        source crashes or asserts on, which the family declares (``hf_refusal``,
        ``lc_refusal``: harness/families/hookspec.py) -- or None (default). A case naming
        this reference is refused in one line, exit 2, before any work (harness/budget.py)."""
        return None

    def schedule_refusal(self, family, config, chunks: tuple[int, ...]) -> str | None:
        """Why this reference cannot run ``config`` of ``family`` on a schedule whose calls
        carry ``chunks`` rows (each sequence's, in order) -- a crash its source predicts,
        which the family declares -- or None (default). Named alone it is refused for it
        (exit 2); beside others it sits the case out in a ``skipped`` row that says why
        (``Build.schedule_refusals``): a known crash is neither an error row nor a pass."""
        return None

    def preflight(self, family, config) -> None:
        """Refuse (a ``UsageError``: one line, exit 2) before any work when the installed
        release of this reference lacks what its adapter reads for ``family`` on
        ``config``: a hook point moved by a new release must never be a KeyError in the
        middle of a matrix. Default: nothing to check."""

    def abort(self) -> None:
        """End at once what a capture in flight runs apart (``runs_apart``: its worker
        process), so that the thread waiting on it returns -- and refuse to start one until
        ``resume``: called on Ctrl-C. Default: nothing runs apart."""

    def resume(self) -> None:
        """Captures may run again after an ``abort`` (called as a case's captures begin).
        Default: nothing to do."""

    def tokenize(self, gguf_path, text: str) -> list[int]:
        raise NotImplementedError(f"reference {self.name} does not tokenize")

    def compute_dtype(self, case_dtype: str) -> str:
        return self.graph_dtype or case_dtype

    def estimate(self, ctx) -> dict[str, dict[str, int]]:
        """What this reference adds to a case's memory (harness/budget.py):
        ``{"parts": {name: bytes}, "phases": {name: bytes}}``."""
        return {"parts": {}, "phases": {}}


@lru_cache(maxsize=1)
def registry() -> dict[str, Reference]:
    out = {}
    for name, ep in plugins.entry_points(GROUP).items():
        obj = plugins.load(GROUP, name, ep)
        ref = obj() if isinstance(obj, type) else obj
        if not isinstance(ref, Reference):
            raise plugins.PluginError(f"reference {name!r} is a {type(ref).__name__}, not a "
                                      "harness.references.Reference")
        ref.name = name
        out[name] = ref
    return out


def names() -> tuple[str, ...]:
    """Every reference's name, in registry order (the order references are captured in)."""
    return tuple(registry())


def all_names() -> tuple[str, ...]:
    """What ``--ref all`` runs: every reference that has joined it (``Reference.in_all``)."""
    return tuple(n for n, r in registry().items() if r.in_all)


def choices() -> tuple[str, ...]:
    """What ``--ref`` takes: a reference's name, or ``all`` (every one, and each with the others)."""
    return (*names(), "all")


def get(name: str) -> Reference:
    reg = registry()
    if name not in reg:
        raise UsageError(f"unknown reference {name!r}; {suggest(name, list(reg) + ['all'])}")
    return reg[name]


def default(file: bool = False) -> str:
    """The reference a case compares against when none is named: the first, or
    for a user's file the one that reads such files."""
    if file:
        for r in registry().values():
            if r.default_for_file:
                return r.name
    return names()[0]


def preflight(names, family, config) -> None:
    """Every named reference's start-up check of ``family`` on ``config`` (and the
    oracle's, which runs beside any low-precision case)."""
    refs = {get(n) for n in names}
    o = oracle_reference()
    if o is not None:
        refs.add(o)
    for r in sorted(refs, key=lambda r: r.name):
        if r.available():
            r.preflight(family, config)


def oracle_reference() -> Reference | None:
    """The reference that can serve as the float64 oracle (HF), or None."""
    return next((r for r in registry().values() if r.oracle), None)
