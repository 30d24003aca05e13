"""Feature tags, derived from what impl is actually told to compute.

A family does not claim a feature; its impl layer configs and weights show it.
That keeps ``conformance features`` honest: a tag means the decoration was
switched on in impl for that case and compared. Each layer kind names its
decorations and reads them off a layer (``harness/kinds/<kind>``); this module
joins them with the case's own (the KV backing). ``SPEC_DECORATIONS`` lists
every decoration the specification names, so a decoration no family exercises
yet is listed as unverified instead of silently missing.
"""

from __future__ import annotations

from . import kinds

# the case's own decorations: where its K/V rows live
CASE_DECORATIONS = {
    "kv_decode": ("contiguous single-sequence KV", "KvStep::Decode"),
    "kv_batched": ("contiguous multi-sequence KV", "KvStep::Batched"),
    "kv_paged": ("paged KV over a block table", "KvStep::Paged"),
    "kv_evict": ("window eviction of the contiguous KV (off by default)", "evict_layer_kv (FRINK_KV_WINDOW)"),
    "kv_ragged": ("sequences of different lengths, first calls and arrivals in one batch (continuous batching)",
                  "forward_multi_seq_kv"),
}


def __getattr__(name: str):
    # every kind's decorations, then the case's: read from the kind plug-ins when first asked
    if name == "SPEC_DECORATIONS":
        value = {**kinds.decorations(), **CASE_DECORATIONS}
    elif name == "REFERENCE_GAPS":
        value = kinds.reference_gaps()
    else:
        raise AttributeError(name)
    globals()[name] = value
    return value


def layer_features(lc, weights: dict | None = None) -> set[str]:
    """The tags ON for one layer (its kind's reading of it; none for an unimplemented layer)."""
    kind = kinds.of(lc)
    return kind.features(lc, weights or {}) if kind is not None else set()


def model_features(layer_cfgs: list, weights) -> set[str]:
    """The union of every layer's tags, then what each kind reads off its whole
    stack of layers (per-layer heads, per-layer theta, ...)."""
    f: set[str] = set()
    by_kind: dict[str, list] = {}
    for lc, w in zip(layer_cfgs, weights):
        f |= layer_features(lc, w)
        kind = kinds.of(lc)
        if kind is not None:
            by_kind.setdefault(kind.name, []).append(lc)
    for name, descs in by_kind.items():
        f = kinds.registry()[name].model_features(descs, f)
    return f
