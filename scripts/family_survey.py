"""Which text decoders both pinned references run, and which of them are families here
(issue 39): a survey read from the references' own sources, not from names.

    python scripts/family_survey.py LLAMA_CPP_TREE

LLAMA_CPP_TREE: the llama.cpp llama-cpp-python vendors (its sdist's vendor/llama.cpp;
``pip download --no-deps --no-binary :all: llama-cpp-python==VERSION``). For every HF
architecture the converter registers as a text model (conversion/__init__.py
``TEXT_MODEL_MAP``), it reads:

- the converter class that registers it (``@ModelBase.register("XForCausalLM", ...)`` in
  conversion/<module>.py) and the arch it writes (``model_arch = gguf.MODEL_ARCH.Y``, the
  class's own or its nearest base's in that file), the arch's name (gguf-py
  constants.py ``MODEL_ARCH_NAMES``) and whether llama.cpp has a graph for it
  (src/models/<arch>.cpp, ``-`` and ``_`` alike);
- transformers' side, from the installed release: the model type whose causal-LM class
  is that architecture (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), or the model type of a
  multimodal class's text config where the architecture is a ``ForConditionalGeneration``;
- whether a family here has that model type (``Family.hf_model_type``).

A row whose both sides exist and no family covers is a candidate; the survey page
(docs/measurements) gives each a reason where it is left out.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def converter_map(tree: Path) -> dict[str, str]:
    """HF architecture -> converter module (conversion/__init__.py TEXT_MODEL_MAP)."""
    src = (tree / "conversion" / "__init__.py").read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.AnnAssign)
                and getattr(n.target, "id", "") == "TEXT_MODEL_MAP")
    return ast.literal_eval(node.value)


def arch_names(tree: Path) -> dict[str, str]:
    src = (tree / "gguf-py" / "gguf" / "constants.py").read_text()
    b = src[src.index("MODEL_ARCH_NAMES"):]
    b = b[:b.index("}")]
    return dict(re.findall(r"MODEL_ARCH\.(\w+)\s*:\s*\"([^\"]+)\"", b))


def registered_arch(tree: Path, module: str, hf_arch: str) -> str | None:
    """The MODEL_ARCH member the class registering ``hf_arch`` in conversion/<module>.py
    writes: its own ``model_arch`` or its nearest base's defined in that file."""
    path = tree / "conversion" / f"{module}.py"
    if not path.exists():
        return None
    mod = ast.parse(path.read_text())
    classes = {n.name: n for n in mod.body if isinstance(n, ast.ClassDef)}

    def arch_of(cls, seen=()):
        for stmt in cls.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(getattr(t, "id", "") == "model_arch" for t in targets):
                    m = re.search(r"MODEL_ARCH\.(\w+)", ast.unparse(stmt.value))
                    if m:
                        return m.group(1)
        for b in cls.bases:
            name = ast.unparse(b).split(".")[-1]
            if name in classes and name not in seen:
                got = arch_of(classes[name], (*seen, name))
                if got:
                    return got
        return None

    for cls in classes.values():
        for d in cls.decorator_list:
            if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("register"):
                names = [a.value for a in d.args if isinstance(a, ast.Constant)]
                if hf_arch in names:
                    return arch_of(cls)
    return None


def hf_model_types() -> dict[str, list[str]]:
    """HF architecture (class name) -> its model types in transformers' auto mappings, each
    followed by its text config's model type where it has one (a multimodal class's text
    decoder: gemma3 -> gemma3_text)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto as ma

    out: dict[str, list[str]] = {}
    for name in dir(ma):
        mapping = getattr(ma, name)
        if not (name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES") and isinstance(mapping, dict)):
            continue
        for mt, cls in mapping.items():
            for c in (cls if isinstance(cls, (list, tuple)) else (cls,)):
                if mt not in out.setdefault(c, []):
                    out[c].append(mt)
    text: dict[str, str | None] = {}
    for c, mts in out.items():
        for mt in list(mts):
            if mt not in text:
                try:
                    cfg = CONFIG_MAPPING[mt]()
                    sub = cfg.get_text_config() if hasattr(cfg, "get_text_config") else None
                    text[mt] = getattr(sub, "model_type", None)
                except Exception:  # a config that needs arguments: its own type alone
                    text[mt] = None
            if text[mt] and text[mt] not in mts:
                mts.append(text[mt])
    return out


def _norm(name: str) -> str:
    """An arch name and its graph file's stem alike: ``glm4moe`` and ``glm4-moe.cpp``."""
    return re.sub(r"[-_.]", "", name)


def survey(tree: Path) -> list[dict]:
    from harness import families

    ours = {}
    for f in families.registry().values():
        ours.setdefault(f.hf_model_type, []).append(f.name)
    names = arch_names(tree)
    graphs = {_norm(p.stem) for p in (tree / "src" / "models").glob("*.cpp")}
    # llama.cpp's own name for an arch's graph, where it is not the arch's (gpt-oss:
    # openai-moe.cpp): llama-arch.cpp {LLM_ARCH_X, "name"} and llama-model.cpp's factory
    # ``case LLM_ARCH_X: return new llama_model_y``
    enum = {v: k for k, v in re.findall(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]+)"\s*\}',
                                         (tree / "src" / "llama-arch.cpp").read_text())}
    factory = dict(re.findall(r"case (LLM_ARCH_\w+):\s*return new llama_model_(\w+)",
                              (tree / "src" / "llama-model.cpp").read_text()))

    def has_graph(arch: str | None) -> bool:
        return bool(arch) and (_norm(arch) in graphs or _norm(factory.get(enum.get(arch, ""), "-")) in graphs)
    types = hf_model_types()
    # the converter's spelling of a class may differ in case from transformers' (MPTForCausalLM,
    # PhiMoEForCausalLM: MptForCausalLM, PhimoeForCausalLM)
    lower = {k.lower(): v for k, v in types.items()}
    rows = []
    for hf_arch, module in sorted(converter_map(tree).items()):
        member = registered_arch(tree, module, hf_arch)
        arch = names.get(member) if member else None
        mts = types.get(hf_arch) or lower.get(hf_arch.lower(), [])
        rows.append({"hf_arch": hf_arch, "converter": f"conversion/{module}.py", "arch": arch,
                     "graph": has_graph(arch),
                     "model_type": ", ".join(mts), "families": sorted({f for mt in mts for f in ours.get(mt, [])})})
    return rows


def main(argv: list[str]) -> int:
    if not argv or not (Path(argv[0]) / "conversion" / "__init__.py").exists():
        print("usage: python scripts/family_survey.py LLAMA_CPP_TREE  (the vendored llama.cpp: "
              "a tree with conversion/__init__.py)", file=sys.stderr)
        return 2
    rows = survey(Path(argv[0]))
    both = [r for r in rows if r["model_type"] and r["graph"]]
    print(f"{len(rows)} architectures the converter registers as text models; {len(both)} that transformers "
          "builds and llama.cpp has a graph for; covered here: "
          f"{sum(bool(r['families']) for r in both)}")
    print("| HF architecture | model type | llama.cpp arch | converter | family here |")
    print("|---|---|---|---|---|")
    for r in rows:
        if not r["model_type"] or not r["graph"]:
            continue
        print(f"| {r['hf_arch']} | {r['model_type']} | {r['arch']} | {r['converter']} | "
              f"{', '.join(r['families']) or '**missing**'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
