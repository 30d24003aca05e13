"""A case run under a mutant (``conformance mutate``): its own module, so the
command's parser is built without importing the case machinery."""

from __future__ import annotations

from dataclasses import dataclass

from ..case import Case


@dataclass(frozen=True)
class MutantCase(Case):
    """One case run under one mutant: a Case (so the matrix's worker pool runs it)
    whose id and dict carry the mutant's name."""

    mutant: str = ""
    mutant_d: float | None = None  # a parametric mutant's perturbation (None: its default)

    def case_id(self) -> str:
        at = "" if self.mutant_d is None else f"@{self.mutant_d:.3g}"
        return f"{self.mutant}{at}::{super().case_id()}"

    def plain(self) -> Case:
        d = self.to_dict()
        d.pop("mutant")
        d.pop("mutant_d")
        return Case.from_dict(d)
