"""Generate harness/gguf/llamacpp_keys.py: which GGUF metadata keys llama.cpp
reads for each architecture, from llama.cpp's own source.

    python scripts/llamacpp_keys.py LLAMA_CPP_TREE > harness/gguf/llamacpp_keys.py

LLAMA_CPP_TREE: the llama.cpp that llama-cpp-python vendors (its sdist's
vendor/llama.cpp). What is read:

- src/llama-arch.cpp: ``LLM_KV_NAMES`` (enum -> "%s.attention.head_count") and
  ``LLM_ARCH_NAMES`` (enum -> "llama");
- src/llama-model.cpp: ``llama_model_base::load_hparams`` -- the keys every
  architecture reads (a block under ``if (arch == LLM_ARCH_X ...)`` belongs to
  those architectures only), the factory (``case LLM_ARCH_X: return new
  llama_model_y``) and the helpers a ``load_arch_hparams`` may call
  (``load_swa_pattern``);
- src/models/*.cpp: every ``llama_model_y::load_arch_hparams`` body, with the
  parent's body where it calls ``llama_model_z::load_arch_hparams(ml)`` or
  defines none of its own (src/models/models.h: ``struct llama_model_y :
  public llama_model_z``).

A key counts as read when its ``LLM_KV_*`` name appears in one of those bodies
(``ml.get_key``, ``get_key_or_arr``, ``get_arr``): the set llama.cpp MAY read;
which of them it reads for a given file's values is the reverse mapping's job
(harness/families/_gguf_import.py). ``general.*`` and ``tokenizer.*`` keys are
left out: they shape no arithmetic.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def body(src: str, start: int) -> str:
    """The brace-balanced block that opens at or after ``start``."""
    i = src.index("{", start)
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return src[i:j + 1]
    raise ValueError("unbalanced braces")


def kv_names(tree: Path) -> tuple[dict[str, str], dict[str, str]]:
    arch_src = (tree / "src" / "llama-arch.cpp").read_text()
    kv = dict(re.findall(r'\{\s*(LLM_KV_\w+)\s*,\s*"([^"]+)"\s*\}', arch_src))
    archs = dict(re.findall(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]+)"\s*\}', arch_src))
    return kv, archs


def generic_keys(model_src: str, kv: dict[str, str]) -> tuple[set[str], dict[str, set[str]]]:
    """load_hparams: the keys for every arch, and those under ``if (arch == ...)``."""
    b = body(model_src, model_src.index("void llama_model_base::load_hparams("))
    only: dict[str, set[str]] = {}
    blocks = []
    for m in re.finditer(r"if \(((?:\s*(?:\|\|)?\s*arch == LLM_ARCH_\w+)+)\s*\)\s*\{", b):
        block = body(b, m.end() - 1)
        blocks.append(block)
        keys = set(re.findall(r"LLM_KV_\w+", block))
        for arch in re.findall(r"LLM_ARCH_\w+", m.group(1)):
            only.setdefault(arch, set()).update(keys)
    for block in blocks:
        b = b.replace(block, "{}", 1)
    return set(re.findall(r"LLM_KV_\w+", b)), only


def arch_keys(tree: Path, model_src: str) -> dict[str, set[str]]:
    """arch enum -> the LLM_KV names its load_arch_hparams (and what it calls) reads."""
    classes: dict[str, str] = {}  # class suffix -> its load_arch_hparams body
    for f in sorted((tree / "src" / "models").glob("*.cpp")):
        src = f.read_text()
        for m in re.finditer(r"void llama_model_(\w+)::load_arch_hparams\(", src):
            classes[m.group(1)] = body(src, m.end())
    parents = dict(re.findall(r"struct llama_model_(\w+)\s*:\s*public llama_model_(\w+)",
                              (tree / "src" / "models" / "models.h").read_text()))
    helpers = {m.group(1): body(model_src, m.end())
               for m in re.finditer(r"void llama_model_base::(load_\w+)\(llama_model_loader & ml[^)]*\)", model_src)
               if m.group(1) not in ("load_hparams", "load_vocab", "load_stats")}

    def keys_of(cls: str, seen=()) -> set[str]:
        if cls in seen:
            return set()
        if cls not in classes:
            parent = parents.get(cls)
            return keys_of(parent, (*seen, cls)) if parent and parent != "base" else set()
        b = classes[cls]
        out = set(re.findall(r"LLM_KV_\w+", b))
        for parent in re.findall(r"llama_model_(\w+)::load_arch_hparams\(ml\)", b):
            out |= keys_of(parent, (*seen, cls))
        for name, hb in helpers.items():
            if re.search(rf"\b{name}\(", b):
                out |= set(re.findall(r"LLM_KV_\w+", hb))
        return out

    factory = body(model_src, model_src.index("llama_model * llama_model_mapping("))
    out: dict[str, set[str]] = {}
    pending: list[str] = []
    for tok in re.finditer(r"case (LLM_ARCH_\w+):|return new llama_model_(\w+)\(", factory):
        if tok.group(1):
            pending.append(tok.group(1))
        else:
            for arch in pending:
                out[arch] = keys_of(tok.group(2))
            pending = []
    return out


# llama_layer's scale companions (``<x>_s``, loaded from ``<tensor>.scale`` by
# llama_model_base's generic pass) -> the GGUF tensor kind they scale
SCALE_TENSORS = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wqkv": "attn_qkv", "wo": "attn_output",
                 "wqkv_gate": "attn_gate", "output": "output", "ssm_in": "ssm_in", "ssm_out": "ssm_out",
                 "ssm_alpha": "ssm_alpha", "ssm_beta": "ssm_beta",
                 **{f"ffn_{p}{s}": f"ffn_{p}{s}" for p in ("up", "gate", "down") for s in ("", "_exps", "_shexp")}}


def graph_sources(tree: Path) -> dict[str, str]:
    """model class -> the source of the graph it builds (src/models/<arch>.cpp); an arch
    that builds another's graph (src/models/models.h: ``using graph =
    llama_model_z::graph;``, granite_moe's is granite's) gets that graph's source too."""
    files = {}
    for f in sorted((tree / "src" / "models").glob("*.cpp")):
        for cls in re.findall(r"llama_model_(\w+)::(?:graph::graph|build_arch_graph)\(", f.read_text()):
            files[cls] = f.read_text()
    models_h = (tree / "src" / "models" / "models.h").read_text()
    for cls, struct in re.findall(r"struct llama_model_(\w+)\s*:[^{]*\{(.*?)\n\};", models_h, re.S):
        if (m := re.search(r"using graph\s*=\s*llama_model_(\w+)::graph;", struct)) and m.group(1) in files:
            files[cls] = files.get(cls, "") + files[m.group(1)]
    return files


def arch_scales(tree: Path, model_src: str) -> dict[str, tuple[set[str], set[str]]]:
    """arch enum -> ``(applied, recurrent_unscaled)``. ``applied``: the tensor kinds
    whose ``.scale`` its graph applies -- the ``<x>_s`` its src/models/<arch>.cpp
    passes on, plus build_qkv's (wq_s, wk_s, wv_s, wqkv_s) where it calls build_qkv. A
    ``.scale`` the graph never passes is loaded and unused. ``recurrent_unscaled``: of
    build_qkv's kinds, those a hybrid graph (``hparams.is_recr(il)``) scales only
    through build_qkv -- its attention layers -- and multiplies unscaled in its
    recurrent layers' builder (``build_lora_mm(model.layers[il].wqkv, input)``, no
    scale argument: qwen3next.cpp build_qkvz, minimax-01.cpp's lightning layer), where
    the same tensor kind is the recurrent projection: a recurrent layer's scale of
    that kind is loaded and unused."""
    files = graph_sources(tree)
    graph = (tree / "src" / "llama-graph.cpp").read_text()
    qkv_body = body(graph, graph.index("llm_graph_qkv llm_graph_context::build_qkv(", graph.index("build_qkv(") + 1))
    qkv = set(re.findall(r"layer\.(\w+)_s\b", qkv_body))
    # the layer builders of the shared graph bases (src/models/*-base.cpp: mamba-base.cpp's
    # build_mamba_layer / build_mamba2_layer pass ssm_in_s / ssm_out_s on to build_lora_mm,
    # delta-net-base.cpp, rwkv*-base.cpp): an arch that calls one applies what it passes on
    helpers: dict[str, set[str]] = {}
    for f in sorted((tree / "src" / "models").glob("*-base.cpp")):
        text = f.read_text()
        for m in re.finditer(r"\bllm_build_\w+_base::(build_\w+)\(", text):
            helpers.setdefault(m.group(1), set()).update(re.findall(r"\b(\w+?)_s\b", body(text, m.end())))
    factory = body(model_src, model_src.index("llama_model * llama_model_mapping("))
    out, pending = {}, []
    for tok in re.finditer(r"case (LLM_ARCH_\w+):|return new llama_model_(\w+)\(", factory):
        if tok.group(1):
            pending.append(tok.group(1))
            continue
        src = files.get(tok.group(2), "")
        explicit = set(re.findall(r"\b(\w+?)_s\b", src))
        for name, passed in helpers.items():
            if re.search(rf"\b{name}\(", src):
                explicit |= passed
        via_qkv = qkv if "build_qkv(" in src else set()
        # a layer weight multiplied with no scale argument: build_lora_mm(<layer>.<x>, <input>)
        unscaled = set(re.findall(r"build_lora_mm\(\s*(?:model\.layers\[il\]|layer)\.(\w+)\s*,\s*[^,()]+\)", src))
        rec = (via_qkv - explicit) & unscaled if "is_recr(" in src else set()
        for arch in pending:
            out[arch] = ({SCALE_TENSORS[u] for u in explicit | via_qkv if u in SCALE_TENSORS},
                         {SCALE_TENSORS[u] for u in rec if u in SCALE_TENSORS})
        pending = []
    return out


def arch_rope_factors(tree: Path, model_src: str) -> set[str]:
    """The arch enums whose graph rotates with a file's ``rope_freqs`` (src/models/<arch>.cpp
    calls ``model.get_rope_factors`` or reads ``layers[il].rope_freqs``, with the graph it
    builds through ``using graph``). An arch whose loader creates the tensor and whose graph
    passes ``nullptr`` as ggml_rope_ext's freq_factors (falcon-h1.cpp) loads it unused."""
    files = graph_sources(tree)
    factory = body(model_src, model_src.index("llama_model * llama_model_mapping("))
    out, pending = set(), []
    for tok in re.finditer(r"case (LLM_ARCH_\w+):|return new llama_model_(\w+)\(", factory):
        if tok.group(1):
            pending.append(tok.group(1))
            continue
        if re.search(r"get_rope_factors\(|layers\[il\]\.rope_freqs\b", files.get(tok.group(2), "")):
            out.update(pending)
        pending = []
    return out


def _installed_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main() -> int:
    tree = Path(sys.argv[1])
    kv, archs = kv_names(tree)
    model_src = (tree / "src" / "llama-model.cpp").read_text()
    generic, only = generic_keys(model_src, kv)
    per_arch = arch_keys(tree, model_src)
    scales = arch_scales(tree, model_src)
    rope_factors = arch_rope_factors(tree, model_src)

    def names(enums) -> list[str]:
        out = set()
        for e in enums:
            name = kv.get(e)
            if name is None or not name.startswith("%s."):
                continue  # general.* / tokenizer.*: no arithmetic
            out.add(name.removeprefix("%s."))
        return sorted(out)

    # the sdist's PKG-INFO above vendor/llama.cpp; a tree extracted on its own (the
    # tests' converter tree) is the installed llama-cpp-python's
    version = (tree.parent.parent / "PKG-INFO")
    stamp = next((line.split(":", 1)[1].strip() for line in version.read_text().splitlines()
                  if line.startswith("Version:")), "?") if version.is_file() else _installed_version()
    print('"""Which GGUF metadata keys llama.cpp reads, per architecture (the part after')
    print('``{arch}.``). GENERATED by scripts/llamacpp_keys.py from the llama.cpp that')
    print(f'llama-cpp-python {stamp} vendors -- do not edit; regenerate with the build.')
    print()
    print("GENERIC: src/llama-model.cpp ``llama_model_base::load_hparams`` (every arch).")
    print("BY_ARCH: the arch's own ``load_arch_hparams`` (src/models/<arch>.cpp), with")
    print("what it calls, plus the load_hparams blocks reserved for that arch.")
    print('"""')
    print()
    print(f"LLAMA_CPP_PYTHON = {stamp!r}")
    print()
    print("GENERIC = frozenset({")
    for n in names(generic):
        print(f"    {n!r},")
    print("})")
    print()
    print("BY_ARCH = {")
    for enum, arch in sorted(archs.items(), key=lambda kv_: kv_[1]):
        if enum not in per_arch:
            continue
        ks = names(per_arch[enum] | only.get(enum, set()))
        print(f"    {arch!r}: frozenset({{{', '.join(repr(k) for k in ks)}}}),")
    print("}")
    print()
    print("# the tensor kinds whose ``.scale`` each arch's graph applies (src/models/<arch>.cpp passes")
    print("# ``<x>_s`` on, or calls build_qkv); any other ``.scale`` is loaded and unused")
    print("SCALES = {")
    for enum, arch in sorted(archs.items(), key=lambda kv_: kv_[1]):
        if enum in scales:
            print(f"    {arch!r}: frozenset({{{', '.join(repr(k) for k in sorted(scales[enum][0]))}}}),")
    print("}")
    print()
    print("# of those, the kinds a hybrid graph scales only through build_qkv (its attention layers)")
    print("# and multiplies unscaled in its recurrent layers (build_lora_mm(model.layers[il].<x>, cur),")
    print("# no scale: qwen3next.cpp build_qkvz): a recurrent layer's .scale of them is loaded and unused")
    print("RECURRENT_UNSCALED = {")
    for enum, arch in sorted(archs.items(), key=lambda kv_: kv_[1]):
        if scales.get(enum, ((), ()))[1]:
            print(f"    {arch!r}: frozenset({{{', '.join(repr(k) for k in sorted(scales[enum][1]))}}}),")
    print("}")
    print()
    print("# the archs whose graph rotates with the file's rope_freqs (src/models/<arch>.cpp calls")
    print("# get_rope_factors or reads layers[il].rope_freqs); elsewhere the tensor is loaded and unused")
    print("ROPE_FACTORS = frozenset({")
    for enum, arch in sorted(archs.items(), key=lambda kv_: kv_[1]):
        if enum in rope_factors:
            print(f"    {arch!r},")
    print("})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
