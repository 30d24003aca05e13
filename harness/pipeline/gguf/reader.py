"""Reading a user's GGUF (``--gguf PATH``): the reverse of the export.

For a user who has only a GGUF -- written by llama.cpp's own converter
(``convert_hf_to_gguf.py``), quantized by ``llama-quantize``, saved by
llama.cpp's model saver (``tests/test-llama-archs``), or anything else that
follows them -- this module rebuilds what the harness otherwise builds itself:

1. the family, from ``general.architecture`` (the family whose ``gguf_arch``
   it is; several: the one NAMED like the arch, or ``--family``);
2. an HF config, from the metadata read as llama.cpp reads the arch
   (``Family.config_from_gguf`` over ``GGUFMeta``, harness/families/_gguf_import.py):
   a key llama.cpp reads is honoured or refused with one line; a key it does
   not read for the arch is ignored and listed (``GGUFSource.ignored``, written
   to the run's meta.json);
3. the HF state dict, from the tensors, each dequantized
   (``gguf.quants.dequantize``: every type the ``gguf`` package has a
   dequantizer for) and placed back through the export run backwards
   (``trace_import``). Every HF tensor must be found and every GGUF tensor
   used;
4. an HF model holding those weights, and from it impl's weights through the
   family's ordinary ``layer_weights`` -- the same code as always.

The case is judged at the coarsest weight type among the file's matrices (the
file decides; ``--gguf-type`` does not apply to a file the user brings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
import contextlib

import numpy as np

from harness.errors import UsageError, suggest
from harness.families._gguf_import import GGUFMeta, rope_freqs, unused_tensors
from harness import kinds, ggml_types

# the tensor helpers stream.py shares with this reader (their own module: no cycle)
from harness.gguf.tensors import ALIGN, aligned_empty, dequantize, dequantizer, param_tensor, place, set_param  # noqa: F401
from harness.lazy import lazy
from harness import families
from harness.gguf.fastread import GGUFFile
from . import stream as streaming

initialization = lazy("transformers.initialization")

torch = lazy("torch")
transformers = lazy("transformers")


class LayerWeights:
    """impl's weights of each layer (``Family.layer_weights`` of the model read back),
    made when a layer is first asked for and kept up to ``KEEP`` bytes: a float64
    copy of every layer's weights up front was a second model held the whole run
    (1.3 GB on a 1B-class file, 11 GB on an 8B one); made again for every
    reference, the 135M-class file's were 750 conversions."""

    KEEP = 256 << 20  # bytes of layer weights kept (a 135M-class file's 30 layers: 212 MB)

    def __init__(self, family, model, config, layer_cfgs, stream=None):
        self.family, self.model, self.config, self.layer_cfgs = family, model, config, layer_cfgs
        self.stream = stream
        self._names: dict[str, dict] = {}
        self._kept: dict[int, dict] = {}
        self._kept_bytes = 0

    def __len__(self) -> int:
        return len(self.layer_cfgs)

    def module(self, i: int):
        """The decoder layer module layer ``i`` runs."""
        return self.family.decoder_layers(self.model)[self.family.layer_module(self.config, i)]

    def holding(self, i: int):
        """Layer ``i``'s weights held for the block (a streamed model's: read, then dropped)."""
        return self.stream.holding(self.module(i)) if self.stream is not None else contextlib.nullcontext()

    def __getitem__(self, i: int) -> dict:
        if not kinds.implemented(self.layer_cfgs[i]):
            return {}
        if i in self._kept:
            return self._kept[i]
        with self.holding(i):
            w = self.family.layer_weights(self.model, self.config, i)
        n = sum(np.asarray(a).nbytes for a in w.values())
        if self._kept_bytes + n <= self.KEEP:
            self._kept[i], self._kept_bytes = w, self._kept_bytes + n
        return w

    def names(self, i: int) -> dict:
        """Layer ``i``'s impl weight NAMES (values None): what the features read, made once
        for each layer description and layer module's parameters (names, shapes) -- the
        names ``layer_weights`` gives follow from those (a bias is a parameter) -- not a
        float64 copy of every layer's weights for their names. A streamed model's are
        made on storage of the right shapes with no values read (``Streamed.shaped``)."""
        if not kinds.implemented(self.layer_cfgs[i]):
            return {}
        mod = self.module(i)
        key = (repr(self.layer_cfgs[i]), tuple((n, tuple(p.shape)) for n, p in mod.named_parameters()))
        if key not in self._names:
            if self.stream is not None and i not in self._kept:
                with self.stream.shaped(mod):
                    self._names[key] = dict.fromkeys(self.family.layer_weights(self.model, self.config, i))
            else:
                self._names[key] = dict.fromkeys(self[i])
        return self._names[key]


@dataclass
class GGUFSource:
    """What ``harness.case.CaseRun`` takes from a GGUF."""
    path: str
    family: Any
    config: Any
    model: Any  # the float32 HF model holding the file's (dequantized) weights
    layer_weights: LayerWeights  # layer i's impl weights, made when asked
    weight_type: str  # the coarsest of the file's matrix types (ggml names: f32, q8_0, q4_k, ...)
    tensor_types: dict[str, str] = field(default_factory=dict)  # GGUF tensor -> its type
    variant: str | None = None
    ignored: dict[str, str] = field(default_factory=dict)  # metadata keys llama.cpp does not read, and why
    unused: list[str] = field(default_factory=list)  # tensors llama.cpp loads and its graph never reads
    hf_types: dict[str, set] = field(default_factory=dict)  # HF tensor -> the types of the GGUF tensors it came from
    other_mode: dict[str, str] = field(default_factory=dict)  # tensors llama.cpp reads only in another mode, and why
    stream: Any = None  # stream.Streamed: the model read one layer at a time (None: held whole)

    def summary(self) -> dict:
        """What the run's meta.json records about the file."""
        counts: dict[str, int] = {}
        for t in self.tensor_types.values():
            counts[t] = counts.get(t, 0) + 1
        return {"path": self.path, "family": self.family.name, "arch": self.family.gguf_arch,
                "variant": self.variant, "weight_type": self.weight_type, "tensor_types": counts,
                "ignored_keys": self.ignored,
                "unused_tensors": {**{n: f"loaded by llama.cpp, read by no op of its {self.family.gguf_arch} graph"
                                      for n in self.unused}, **self.other_mode}}


# The archs whose graph adds an output.bias to the logits (src/models/<arch>.cpp:
# ``output_b = create_tensor(tn(LLM_TENSOR_OUTPUT, "bias"), ..., TENSOR_NOT_REQUIRED)`` and
# ``cur = ggml_add(ctx0, cur, model.output_b)`` after the lm_head; qwen2.cpp lines 27, 147):
# HF's head (bias=False in Qwen2ForCausalLM) is given the bias, so both compute the file's logits.
OUTPUT_BIAS_ARCHS = frozenset({"qwen2", "qwen2vl", "phi2", "phi3", "phimoe", "dream"})

# Tensors an arch creates only for classifier pooling (LLAMA_POOLING_TYPE_RANK: llama-graph.cpp
# build_pooling reads cls / cls_b / cls_out / cls_out_b / cls_norm; qwen3.cpp line 29 creates
# cls.output TENSOR_NOT_REQUIRED for its rerank head). A generation run never reads them.
POOLING_TENSORS = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias", "cls.norm.weight",
                   "cls.norm.bias")


def other_mode_tensors(infos, arch: str) -> dict[str, str]:
    """The file's tensors llama.cpp reads only in a mode the harness does not run
    (classifier pooling), and why: ignored, listed in meta.json."""
    return {n: f"read by llama.cpp's {arch} graph only for classifier pooling (rerank: llama-graph.cpp "
               "build_pooling); a generation run never reads it" for n in infos if n in POOLING_TENSORS}


def head_with_bias(model) -> None:
    """``model``'s output head replaced by one with a bias (zeros, filled by the
    reverse map from output.bias), its weight the same parameter: a tied head
    stays tied."""

    old = model.get_output_embeddings()
    new = torch.nn.Linear(old.in_features, old.out_features, bias=True, dtype=old.weight.dtype)
    new.weight = old.weight
    with torch.no_grad():
        new.bias.zero_()
    model.set_output_embeddings(new)


def read_fields(reader) -> dict[str, Any]:
    if hasattr(reader, "values"):  # fastread.GGUFFile: decoded once
        return dict(reader.values)
    out = {}
    for k, f in reader.fields.items():
        try:
            out[k] = f.contents()
        except Exception:  # a field this gguf version cannot decode: keep its presence
            out[k] = None
    return out


def importable_archs() -> dict[str, list[str]]:
    """arch -> the families that can read it."""
    out: dict[str, list[str]] = {}
    for name, fam in families.registry().items():
        if fam.gguf_arch and fam.gguf_import_unsupported() is None:
            out.setdefault(fam.gguf_arch, []).append(name)
    return out


def candidate_families(arch: str, family: str | None, path: str = "") -> list:
    """The families that may read a file of ``arch``: ``--family``'s, or every
    family of the arch, the one NAMED like the arch first (``read_config`` takes
    it where its reverse accepts the file -- a llama file is llama's, though
    mistral and internlm3 read it too -- and otherwise keeps those of the others
    whose reverse accepts it: deepseek2 is DeepSeek V2's softmax router or V3's
    sigmoid one, an MoE llama file mixtral's). A family whose files another
    family reads as they are (``gguf_reads_as``) is read only by --family."""

    reg = families.registry()
    if family:
        cands = [families.get(family)]
        if cands[0].gguf_arch != arch:
            raise UsageError(f"--gguf {path}: the file's architecture is {arch!r}, family {family} reads "
                             f"{cands[0].gguf_arch or 'no GGUF'}")
    else:
        cands = [f for f in reg.values() if f.gguf_arch == arch and not f.gguf_reads_as]
        if not cands:
            ok = importable_archs()
            raise UsageError(f"--gguf {path}: unknown GGUF architecture {arch!r}; {suggest(arch, sorted(ok))}")
        named = [f for f in cands if f.name == arch]
        cands = named + [f for f in cands if f not in named]
    for fam in cands:
        why = fam.gguf_import_unsupported()
        if why:
            raise UsageError(f"--gguf is not supported for family {fam.name}: {why}")
    return cands


def read_config(cands: list, arch: str, values: dict, shapes: dict, tensors: dict, path: str):
    """``(family, HF config kwargs, GGUFMeta)`` of the one candidate family whose
    reverse reads the file (several: the caller must choose with --family)."""
    found, refusals = [], []
    for k, fam in enumerate(cands):
        meta = GGUFMeta(arch, values, path)
        try:
            kw = fam.config_from_gguf(meta, shapes, tensors)
            rope_freqs(meta, kw, tensors)
            left = meta.unhonoured()
            if left:
                raise UsageError(f"--gguf {path}: llama.cpp reads {', '.join(left[:4])} for {arch}, and family "
                                 f"{fam.name}'s reverse mapping does not honour {'it' if len(left) == 1 else 'them'}")
        except UsageError as e:
            refusals.append(e)
            continue
        found.append((fam, kw, meta))
        if k == 0 and fam.name == arch and len(cands) > 1:
            return found[0]  # the arch's own family reads it: the others are aliases of it
    if len(found) == 1:
        return found[0]
    if not found:
        raise refusals[0] if len(refusals) == 1 else UsageError(
            f"{refusals[0]} (and every other family of {arch!r} refuses the file: "
            f"{', '.join(f.name for f in cands)})")
    raise UsageError(f"--gguf {path}: architecture {arch!r} is read by families "
                     f"{', '.join(f.name for f, _, _ in found)}; choose one with --family")


def open_reader(path: str):
    """The file's metadata and tensor table (``fastread.GGUFFile``: gguf-py's
    reader takes 15 s over a 262k-token vocabulary), or one line saying why it
    cannot be read."""

    p = Path(path)
    try:
        reader = GGUFFile(str(p))  # every tensor's data must lie inside the file (a truncated download maps short)
    except Exception as e:  # not a GGUF / truncated: the reader raises ValueError, struct errors, ...
        raise UsageError(f"--gguf {path}: not a readable GGUF file ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:160]})") from None
    return reader


def load(path: str, family: str | None = None, stream=None) -> GGUFSource:
    """The file read back (see the module docstring); anything the reverse
    cannot make of it is one line (UsageError), an unexpected failure included.
    ``stream``: read the model one layer at a time (stream.py): a bool, or a
    callable ``(family, config) -> bool`` deciding once the file's config is read
    (the pipeline passes the memory budget's, harness/budget.py: the budget sits
    above this package); None: as ``CONFORMANCE_GGUF_STREAM`` says, else whole."""
    try:
        return _load(path, family, stream)
    except UsageError:
        raise
    except Exception as e:  # a file this reverse did not foresee: one line, never a traceback
        raise UsageError(f"--gguf {path}: could not be read back ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]})") from None


def _load(path: str, family: str | None = None, stream=None) -> GGUFSource:
    reader = open_reader(path)
    values = read_fields(reader)
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise UsageError(f"--gguf {path}: no general.architecture")
    cands = candidate_families(arch, family, path)

    infos = {t.name: t for t in reader.tensors}
    types = {n: t.tensor_type.name.lower() for n, t in infos.items()}
    known = ggml_types.readable()
    odd = sorted({ty for ty in types.values() if ty not in known})
    if odd:
        raise UsageError(f"--gguf {path}: tensor type {', '.join(t.upper() for t in odd)} cannot be dequantized "
                         f"(no dequantizer in the gguf package); readable: "
                         f"{', '.join(sorted(t.upper() for t in known))}")
    # a tensor llama.cpp reads only in another mode than generation (classifier pooling):
    # ignored, and listed in meta.json as ignored keys are
    other_mode = other_mode_tensors(infos, arch)
    used = {n: t for n, t in infos.items() if n not in other_mode}
    types = {n: types[n] for n in used}
    shapes = {n: tuple(int(d) for d in reversed(t.shape.tolist())) for n, t in used.items()}
    tensors = {n: dequantizer(t) for n, t in used.items()}
    fam, kw, meta = read_config(cands, arch, values, shapes, tensors, path)
    config = fam.config_from_kwargs(kw, f"--gguf {path}: the HF config refused the file's settings")
    variant = fam.gguf_variant_of(shapes)

    kwargs = {} if fam.experts_implementation is None else {"experts_implementation": fam.experts_implementation}
    if callable(stream):
        stream = bool(stream(fam, config)) and bool(getattr(fam, "layer_major", False))
    elif stream is None:
        stream = streaming.wanted(fam, 0, 1)  # the environment's word only: no budget known here
    else:
        stream = bool(stream) and bool(getattr(fam, "layer_major", False))
    try:
        # no random initialisation: every parameter is the file's (trace_import covers each
        # element, strict below); buffers (RoPE tables) are computed in __init__ as always.
        # A model read layer by layer (stream.py) is built with its parameters on the meta device

        with initialization.no_init_weights(), (streaming.params_on_meta() if stream else contextlib.nullcontext()):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32,
                                                     **kwargs).eval()
        model.tie_weights()  # what init_weights does besides initialising (skipped with it)
    except (ValueError, TypeError, KeyError, AssertionError, RuntimeError) as e:
        raise UsageError(f"--gguf {path}: HF cannot build family {fam.name} from the file's config: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    fam.gguf_patch_model(model, config)
    if "output.bias" in used and arch in OUTPUT_BIAS_ARCHS:
        head_with_bias(model)
    provenance: dict[str, list[str]] = {}
    st = None
    if stream:
        # names and shapes checked now, as the in-memory reading refuses them; each layer
        # read when it computes (stream.py)
        st = streaming.Streamed(fam, model, config, variant, path, tensors, shapes, reader, provenance)
        model.conformance_stream = st  # what the HF capture reads each module through
    else:
        state = fam.gguf_import_tensors(tensors, model, config, variant, path, provenance)
        missing, unexpected = place(model, state, path)
        # a tied head shares token_embd's storage: loaded with it, "missing" by name only
        emb = getattr(model.get_input_embeddings(), "weight", None)
        sd = model.state_dict()
        tied = {k for k in missing if emb is not None and k in sd and sd[k].data_ptr() == emb.data_ptr()}
        # buffers the export drops (trace_import): computed in __init__, as the RoPE tables
        tied |= {k for k in missing if k in dict(model.named_buffers()) and k not in state}
        if set(missing) - tied or unexpected:
            raise UsageError(f"--gguf {path}: the weights do not fit family {fam.name}'s HF model "
                             f"(missing {sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]})")
    lw = LayerWeights(fam, model, config, fam.layer_configs(config, variant), st)
    mats = [types[n] for n in used if len(shapes[n]) >= 2]
    hf_types = {h: {types[g] for g in gs if g in types} for h, gs in provenance.items()}
    return GGUFSource(str(path), fam, config, model, lw, ggml_types.coarsest(mats), types, variant,
                      meta.ignored(), unused_tensors(used, arch, fam.gguf_recurrent_layers(config)), hf_types,
                      other_mode, st)
