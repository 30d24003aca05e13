"""A mutant: one deliberate bug in impl, as data (``harness.mutants`` applies them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    name: str
    decoration: str  # the feature tag it breaks
    module: str  # e.g. "impl.attention"
    old: str
    new: str
    case: dict = field(default_factory=dict)  # Case kwargs that exercise the decoration
    first_probe: str = ""  # the probe where it first acts, in dataflow order
    layer: int | None = None  # the first layer it acts on (None: the first attention layer)
    doc: str = ""
    # True: it breaks the attention's core (mask, positions, default scale, residual,
    # input norm), which every case exercises whatever its features; `conformance
    # mutate` then runs it on every case, not only those with its decoration
    core: bool = False
    # why feature bisection cannot name the decoration (a core mutant; a decoration
    # the HF reference cannot switch off); empty: it must name it
    bisect_note: str = ""
    # wrong by a little (a parameter perturbed, one pair short) rather than a gross break
    subtle: bool = False
    # parametric: ``new`` holds the placeholder ``{d}``, a relative perturbation of the
    # parameter it breaks, and this is its default size; ``conformance mutate
    # --sensitivity`` searches the smallest ``d`` the matrix still catches
    param: float | None = None
    # the precisions whose rounding leaves it visible (empty: every one): a 1% error of a
    # parameter is below bfloat16's own rounding, and the score per dtype says so
    dtypes: tuple[str, ...] = ()

    def text(self, d: float | None = None) -> str:
        """The replacement snippet, with a parametric mutant's perturbation filled in."""
        if self.param is None:
            return self.new
        return self.new.replace("{d}", repr(float(self.param if d is None else d)))

    def visible_at(self, dtype: str) -> bool:
        return not self.dtypes or dtype in self.dtypes
