"""Reading a user's GGUF (``--gguf PATH``): the reverse of the export.

For a user who has only a GGUF -- written by llama.cpp's own converter
(``convert_hf_to_gguf.py``) or anything else that follows it -- this module
rebuilds what the harness otherwise builds itself:

1. the family, from ``general.architecture`` (the family whose ``gguf_arch``
   it is; several: the one NAMED like the arch, or ``--family``);
2. an HF config, from the metadata (``Family.config_from_gguf``, the reverse
   of ``Family.gguf_params``). Every ``{arch}.*`` key must be understood: a key
   the family's reverse did not read is refused, never ignored -- it may change
   what llama.cpp computes (a window, a softcap, experts);
3. the HF state dict, from the tensors (``Family.gguf_import_tensors``: the
   gguf tensor-name map run backwards over the HF names of a model built from
   that config, each tensor dequantized and passed through
   ``Family.gguf_untransform``, the inverse of ``gguf_transform`` -- llama:
   the converter's Q/K row permutation). Every HF tensor must be found and
   every GGUF tensor used (``rope_freqs``, experts, ... are refused);
4. an HF model holding those weights, and from it impl's weights through the
   family's ordinary ``layer_weights`` -- the same code as always.

Weights: F32, F16, BF16 and Q8_0 (``gguf.quants.dequantize``; all four are
exact in float32). The case is judged at the coarsest type among the file's
matrices (the file decides; ``--gguf-type`` does not apply to a file the user
brings). Other quantizations are refused: the tolerance policy has no entry
for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError, suggest
from ..families.base import NotInImpl
from ..families._gguf_import import GGUFMeta

# gguf tensor type -> the weight-type name the case and the policy use
WEIGHT_TYPE_NAMES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
_COARSENESS = {"f32": 0, "f16": 1, "bf16": 1, "q8_0": 2}


@dataclass
class GGUFSource:
    """What ``harness.case.CaseRun`` takes from a user's GGUF."""

    path: str
    family: Any
    config: Any
    model: Any  # the float32 HF model holding the file's (dequantized) weights
    layer_weights: list[dict]
    weight_type: str  # the coarsest of the file's matrix types: f32 / f16 / bf16 / q8_0
    tensor_types: dict[str, str] = field(default_factory=dict)


def read_fields(reader) -> dict[str, Any]:
    out = {}
    for k, f in reader.fields.items():
        try:
            out[k] = f.contents()
        except Exception:  # a field this gguf version cannot decode: keep its presence
            out[k] = None
    return out


def importable_archs() -> dict[str, list[str]]:
    """arch -> the families that can read it."""
    from .. import families

    out: dict[str, list[str]] = {}
    for name, fam in families.registry().items():
        if fam.gguf_arch and fam.gguf_import_unsupported() is None:
            out.setdefault(fam.gguf_arch, []).append(name)
    return out


def pick_family(arch: str, family: str | None, path: str = ""):
    from .. import families

    reg = families.registry()
    if family:
        fam = families.get(family)
        if fam.gguf_arch != arch:
            raise UsageError(f"--gguf {path}: the file's architecture is {arch!r}, family {fam.name} reads "
                             f"{fam.gguf_arch or 'no GGUF'}")
    else:
        cands = [f for f in reg.values() if f.gguf_arch == arch]
        if not cands:
            ok = importable_archs()
            raise UsageError(f"--gguf {path}: unknown GGUF architecture {arch!r}; {suggest(arch, sorted(ok))}")
        named = [f for f in cands if f.name == arch]
        if named:
            fam = named[0]
        elif len(cands) == 1:
            fam = cands[0]
        else:
            raise UsageError(f"--gguf {path}: architecture {arch!r} is read by families "
                             f"{', '.join(f.name for f in cands)}; choose one with --family")
    why = fam.gguf_import_unsupported()
    if why:
        raise UsageError(f"--gguf is not supported for family {fam.name}: {why}")
    return fam


def load(path: str, family: str | None = None) -> GGUFSource:
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as e:  # not a GGUF / truncated: the reader raises ValueError, struct errors, ...
        raise UsageError(f"--gguf {path}: not a readable GGUF file ({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None
    values = read_fields(reader)
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise UsageError(f"--gguf {path}: no general.architecture")
    fam = pick_family(arch, family, path)

    infos = {t.name: t for t in reader.tensors}
    types = {n: t.tensor_type.name for n, t in infos.items()}
    odd = sorted({ty for ty in types.values() if ty not in WEIGHT_TYPE_NAMES})
    if odd:
        raise UsageError(f"--gguf {path}: tensor types {', '.join(odd)} are not read; valid: "
                         f"{', '.join(WEIGHT_TYPE_NAMES)} (the types the tolerance policy knows)")
    shapes = {n: tuple(int(d) for d in reversed(t.shape.tolist())) for n, t in infos.items()}
    meta = GGUFMeta(arch, values, path)
    kw = fam.config_from_gguf(meta, shapes)
    left = meta.unread()
    if left:
        raise UsageError(f"--gguf {path}: metadata keys family {fam.name}'s reverse mapping does not read "
                         f"(each may change what llama.cpp computes): {', '.join(left[:6])}")
    config = fam.config_from_kwargs(kw, f"--gguf {path}: the HF config refused the file's settings")

    def loader(info):
        def get():
            a = gguf.quants.dequantize(info.data, info.tensor_type)
            return np.array(a, dtype=np.float32).reshape(tuple(int(d) for d in reversed(info.shape.tolist())))
        return get

    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    except (ValueError, TypeError, KeyError, AssertionError, RuntimeError) as e:
        raise UsageError(f"--gguf {path}: HF cannot build family {fam.name} from the file's config: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    state = fam.gguf_import_tensors({n: loader(t) for n, t in infos.items()}, model, config)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    # a tied head shares token_embd's storage: loaded with it, "missing" by name only
    emb = getattr(model.get_input_embeddings(), "weight", None)
    sd = model.state_dict()
    tied = {k for k in missing if emb is not None and k in sd and sd[k].data_ptr() == emb.data_ptr()}
    if set(missing) - tied or unexpected:
        raise UsageError(f"--gguf {path}: the weights do not fit family {fam.name}'s HF model "
                         f"(missing {sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]})")
    layer_cfgs = fam.layer_configs(config, fam.variants[0] if fam.variants else None)
    lw = [{} if isinstance(lc, NotInImpl) else fam.layer_weights(model, config, i) for i, lc in enumerate(layer_cfgs)]
    mats = [WEIGHT_TYPE_NAMES[types[n]] for n in infos if len(shapes[n]) >= 2]
    wt = max(mats or ["f32"], key=lambda t: _COARSENESS[t])
    return GGUFSource(str(p), fam, config, model, lw, wt, types)
