"""Which layers and probes a case captures and compares (``--layers``, ``--probes``).

A real model has dozens of layers and every probe of every layer costs memory,
disk and time on each side; ``--layers 0,5,-1`` and ``--probes q_rope,attn_probs``
restrict all of them at once -- the HF hooks, the llama.cpp callback names, the
impl layers run, the float64 oracle (which then stops after the last layer
asked for) -- and the rows cover just that.

A selection never makes a pass mean less: ``layer_in`` (every layer's
teacher-forced input) and each selected layer's guard probe (``attn_out``, what
everything the attention computes flows into; harness/verdict.py) are always
captured and compared, and a probe that is derived from another (MLA's rope
slices ``q_pe`` / ``k_pe``; llama.cpp's ``attn_out`` as ``ffn_inp - layer_in``
where its graph names none) brings what it is derived from.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.probes import LAYER_PROBES, MODEL_PROBES

from .errors import UsageError, suggest

ALL_PROBES = LAYER_PROBES + MODEL_PROBES
# always captured: the teacher-forced input, the guard probes and what derives them
ALWAYS = ("layer_in", "attn_out", "resid_mid")
# probe -> the probes it is derived from (harness/families/_mla.py hf_derived)
NEEDS = {"q_pe": ("q_rope",), "k_pe": ("k_rope",)}


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """``"0,5,-1"`` -> ``(0, 5, -1)``; None / ``"*"`` / ``"all"``: every layer."""
    if text is None or str(text).strip() in ("", "*", "all"):
        return None
    try:
        return tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise UsageError(f"--layers takes layer indices separated by commas (negative from the end), "
                         f"e.g. 0,5,-1; got {text!r}") from None


def parse_probes(text: str | None) -> tuple[str, ...] | None:
    """``"q_rope,attn_out"`` -> the names, each checked; None / ``"*"``: every probe."""
    if text is None or str(text).strip() in ("", "*", "all"):
        return None
    names = tuple(p.strip() for p in str(text).split(",") if p.strip())
    for p in names:
        if p not in ALL_PROBES:
            raise UsageError(f"unknown probe {p!r} in --probes; {suggest(p, ALL_PROBES)}")
    if not names:
        raise UsageError(f"--probes names no probe; valid: {', '.join(ALL_PROBES)}")
    return names


@dataclass(frozen=True)
class Selection:
    """The resolved selection of one case: layer indices (0-based, sorted) and the
    probe names captured (None: all)."""

    layers: tuple[int, ...]
    probes: frozenset | None
    n_layers: int

    @classmethod
    def of(cls, layers: str | None, probes: str | None, n_layers: int) -> "Selection":
        idx = parse_layers(layers)
        if idx is None:
            chosen = tuple(range(n_layers))
        else:
            bad = [i for i in idx if not -n_layers <= i < n_layers]
            if bad:
                raise UsageError(f"--layers {layers}: the model has {n_layers} layers; valid indices are "
                                 f"0..{n_layers - 1} or -{n_layers}..-1")
            chosen = tuple(sorted({i % n_layers for i in idx}))
        names = parse_probes(probes)
        if names is None:
            return cls(chosen, None, n_layers)
        full = set(names) | set(ALWAYS)
        for p in names:
            full |= set(NEEDS.get(p, ()))
        return cls(chosen, frozenset(full), n_layers)

    @property
    def every_layer(self) -> bool:
        return len(self.layers) == self.n_layers

    def layer(self, i: int) -> bool:
        return i in self.layers

    def probe(self, name: str) -> bool:
        return self.probes is None or name in self.probes

    def key(self, key: str) -> bool:
        """A capture key (``L3.q_rope``, ``logits``) is kept."""
        if key.startswith("L") and "." in key:
            layer, probe = key.split(".", 1)
            return self.layer(int(layer[1:])) and self.probe(probe)
        return self.probe(key)

    @property
    def model_probes(self) -> bool:
        """Whether any model-level probe (embeddings, final norm, logits) is kept."""
        return any(self.probe(p) for p in MODEL_PROBES)

    @property
    def last(self) -> int:
        return self.layers[-1] if self.layers else -1

    def label(self) -> dict:
        """What a row and meta.json say about the selection (empty: everything)."""
        out = {}
        if not self.every_layer:
            out["layers"] = ",".join(map(str, self.layers))
        if self.probes is not None:
            out["probes"] = ",".join(p for p in ALL_PROBES if p in self.probes)
        return out
