"""``conformance list``: families (variants, feature tags, whether ``--gguf``
reads their files), references, candidates, backends, probes."""

from __future__ import annotations

from ..errors import UsageError
from impl.backend import BACKENDS, DEVICES, DTYPES
from impl.kv import KV_MODES
from ..schedule import SCHEDULES
from contract.probes import LAYER_PROBES, MODEL_PROBES
from .. import catalog, families, references
from ..case import GGUF_TYPES
from .. import candidates, mutants


def register(sub) -> None:
    ls = sub.add_parser("list", help="families, features, probes, backends")
    ls.add_argument("--no-features", dest="features", action="store_false",
                    help="skip the feature tags (derived once per code version by building each family; cached)")
    ls.set_defaults(fn=cmd_list)


def cmd_list(a) -> int:
    """Families (variants, feature tags, whether ``--gguf`` reads their files),
    references, backends, probes. Imports neither torch nor transformers when the
    features are cached (``harness/catalog.py``)."""

    reg = families.registry()
    feats = catalog.family_features(reg, catalog.say_stderr) if a.features else {}
    print("families (--family; --variant: the first is the default; --gguf FILE: files of which families it reads):")
    for name, fam in reg.items():
        print(f"  {name:<16} hf={fam.hf_model_type:<16} gguf={fam.gguf_arch or '-':<12} {fam.description}")
        pad = f"  {'':<16} "
        if fam.variants:
            print(f"{pad}variants: {', '.join(fam.variants)}")
        why = fam.gguf_import_unsupported()
        print(f"{pad}--gguf: " + (f"reads {fam.gguf_arch} files" if why is None else f"no ({why})"))
        for v in catalog.variants(fam) if feats else ():
            label = f"features ({v})" if v else "features"
            print(f"{pad}{label}: {', '.join(feats[name][v or ''])}")
    print(f"references (--ref): {', '.join(references.choices())}")
    named_only = [n for n in references.names() if n not in references.all_names()]
    if named_only:  # Reference.in_all: not yet judged on every family it implements
        print(f"  all = {', '.join(references.all_names())}; {', '.join(named_only)} only where named "
              f"(--ref hf,{named_only[0]})")

    print("candidates (--candidate; entry points of the group attn_conformance.candidates; or dump:DIR):")
    for name in candidates.registry():
        try:
            desc = candidates.get(name).description
        except UsageError as e:
            desc = f"(does not load: {e})"
        print(f"  {name:<20} {desc}")
    print(f"backends: {', '.join(BACKENDS)}; devices: {', '.join(DEVICES)}; dtypes: {', '.join(DTYPES)}")
    print(f"kv modes: {', '.join(KV_MODES)}; schedules: {', '.join(SCHEDULES)} or chunk sizes (5,1,1)")
    print(f"GGUF weight types (--gguf-type; --gguf reads the same): {', '.join(GGUF_TYPES)}")
    print(f"layer probes: {', '.join(LAYER_PROBES)}")
    print(f"model probes: {', '.join(MODEL_PROBES)}")

    by_kind: dict = {}
    for name, m in mutants.registry().items():
        by_kind.setdefault(m.module.rsplit(".", 1)[-1], []).append(name)
    print(f"mutants (conformance mutate --mutants NAME,...; {sum(map(len, by_kind.values()))} deliberate bugs in impl, "
          "each kind's in harness/kinds/<kind>/mutants), by the impl module they break:")
    for mod, names in sorted(by_kind.items()):
        print(f"  {mod}: {', '.join(sorted(names))}")
    return 0
