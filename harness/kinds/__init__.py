"""Layer kinds: what the harness knows about each kind of layer, in one folder each.

A layer's description (``contract.layers``) names its ``kind``; the kind's
plug-in (entry point group ``attn_conformance.kinds``; the built-ins are the
folders of this package: ``attention``, ``mla``, ``recurrent`` -- the last
registered under every recurrent kind name) owns everything about layers
of that kind that is not a family's business:

- ``decorations``: the feature tags the kind can carry, what each is and where
  the spec names it (``conformance features`` lists the ones no case exercised);
  ``reference_gaps``: decorations no reference family has, and what checks them;
- ``features(desc, weights)`` / ``model_features(descs)``: the tags that are ON
  for a layer (from what impl is told to compute, never from what a family claims);
- ``rope_probe``: the first probe downstream of the layer's RoPE (its bound's
  RoPE term starts there, harness/scaling.py);
- ``dims(desc)``: ``(hidden, query heads, kv heads, key width, value width)`` of
  one position's cache row, for the memory plan (harness/budget.py), and
  ``probe_elems``: what else one layer's probes hold (a recurrent layer's
  probes and per-call states, where there is no cache row);
- ``spec_layer(desc, weights, x)``: the spec's own float64 formula for one layer
  (harness/specref.py: the oracle for what no reference can express), and the
  fuzzer's strategy over the kind's descriptions (``spec_strategy``,
  ``spec_weights``: one layer outside what any reference family can say);
- ``mutant_modules``: the modules holding the kind's mutants (deliberate impl
  bugs, harness/mutants);
- ``switches(family)``: the kind's feature-bisection switches of the seeded model.

Probes are not here: a description says which it must emit
(``expected_probes``), the vocabulary is ``contract.probes``. A layer whose
description is ``contract.layers.Unimplemented`` has no kind plug-in: nothing
implements it, and the report says so (``not-implemented``).
"""

from __future__ import annotations

from functools import lru_cache

from .. import plugins
from contract.layers import Unimplemented

GROUP = "kinds"


class LayerKind:
    name: str = ""
    description: type = object  # the contract.layers class of this kind
    decorations: dict[str, tuple[str, str]] = {}
    reference_gaps: dict[str, str] = {}
    rope_probe: str = "q_rope"
    mutant_modules: tuple[str, ...] = ()

    def features(self, desc, weights: dict | None = None) -> set[str]:
        return set()

    def model_features(self, descs: list, tags: set[str]) -> set[str]:
        """The model's tags, given the union of its layers' (``tags``) and this kind's
        layers of it (``descs``): what needs the whole stack (per-layer heads, ...)."""
        return tags

    def dims(self, desc) -> tuple[int, int, int, int, int]:
        raise NotImplementedError

    def probe_elems(self, desc, seqs: int, tokens: int) -> int:
        """Elements of one layer's probes that ``dims`` does not describe (a recurrent
        layer's probes and per-call state snapshots), for the memory plan."""
        return 0

    def spec_layer(self, desc, weights: dict, x):
        raise NotImplementedError(f"no spec formula for layers of kind {self.name}")

    def switches(self, family) -> dict:
        """``{tag: harness.families.ModelSwitch}``: the kind's switches of the seeded model."""
        return {}

    def spec_strategy(self, st, n: int, hid: int, opts: dict):
        """A hypothesis strategy of one description of this kind (harness/fuzz.py)."""
        raise NotImplementedError(f"the fuzzer draws no {self.name} layer")

    def spec_weights(self, desc, opts: dict, rng) -> dict:
        raise NotImplementedError(f"the fuzzer draws no {self.name} layer")


@lru_cache(maxsize=1)
def registry() -> dict[str, LayerKind]:
    out: dict[str, LayerKind] = {}
    for name, ep in plugins.entry_points(GROUP).items():
        obj = plugins.load(GROUP, name, ep)
        kind = obj() if isinstance(obj, type) else obj
        if not isinstance(kind, LayerKind):
            raise plugins.PluginError(f"kind {name!r} is a {type(kind).__name__}, not a harness.kinds.LayerKind")
        kind.name = name
        out[name] = kind
    return out


def of(desc) -> LayerKind | None:
    """The kind plug-in of a layer description (None: an unimplemented layer, or a
    description of a kind no plug-in is installed for)."""
    return registry().get(getattr(desc, "kind", None)) if implemented(desc) else None


def implemented(desc) -> bool:
    """Whether a layer has a description a candidate can compute (not ``Unimplemented``)."""
    return desc is not None and not isinstance(desc, Unimplemented)


def label(desc) -> str:
    """The layer kind a report row carries (``model`` for a model-level probe)."""
    return "model" if desc is None else desc.label


def spec_layer(desc, weights: dict, x):
    """The spec's own float64 probes of one layer, by its kind's formula
    (``harness/kinds/<kind>/spec.py``, from the pieces in harness/specref.py)."""
    kind = of(desc)
    if kind is None:
        raise ValueError(f"no spec formula for a layer of kind {getattr(desc, 'kind', desc)!r}")
    return kind.spec_layer(desc, weights, x)


def decorations() -> dict[str, tuple[str, str]]:
    """Every kind's decorations (tag -> what it is, where the spec names it)."""
    out: dict[str, tuple[str, str]] = {}
    for k in registry().values():
        out.update(k.decorations)
    return out


def reference_gaps() -> dict[str, str]:
    out: dict[str, str] = {}
    for k in registry().values():
        out.update(k.reference_gaps)
    return out
