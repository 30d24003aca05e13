"""Writing a GGUF of the family's HF weights, the way llama.cpp's converter would.

The family decides the metadata (``Family.gguf_params``, mirroring the
converter's ``set_gguf_parameters``) and the tensors with their transforms
(``Family.gguf_tensors``, mirroring ``modify_tensors``); this module writes
them with the ``gguf`` package, adds a tiny vocabulary llama.cpp accepts, and
caches the file by content.

Weight types: F32 by default; F16, BF16 and Q8_0 on request. As in the
converter (``conversion/base.py``, ``prepare_tensors``), only 2-D weight
matrices take the requested type; norms, biases, sinks and other 1-D tensors
stay F32, and so do the matrices the converter always writes as F32 (router
gates, SSM conv kernels, ...: ``converter_keeps_f32``); a row length Q8_0
cannot block falls back to F16.
"""

from __future__ import annotations

from pathlib import Path
import re
import copy

import numpy as np

from harness import cache
from harness.atomic import atomic_path
from harness.lazy import lazy
from harness.versions import versions
from harness.families._gguf_export import GGUFExport
from harness.families.base import Family

gguf = lazy("gguf")
torch = lazy("torch")
transformers = lazy("transformers")

WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0")
EXPORT_SCHEMA = 1


# the smallest seeded vocabulary with the 256 byte tokens: llama.cpp's SPM tokenizer
# falls back to them for text no piece covers, and without them aborts
# (std::out_of_range from unordered_map::at in llama-vocab.cpp byte_to_token)
BYTE_VOCAB_MIN = 3 + 256 + 1


def tiny_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style ("llama") vocabulary of ``n`` tokens: unk, bos, eos,
    the 256 byte tokens when there is room, then plain pieces. Token types are
    gguf.TokenType values (NORMAL 1, UNKNOWN 2, CONTROL 3, BYTE 6)."""
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    if n >= BYTE_VOCAB_MIN:
        for b in range(256):
            toks.append(f"<0x{b:02X}>")
            scores.append(0.0)
            types.append(6)
    i = 0
    while len(toks) < n:
        toks.append(f"\u2581t{i}")
        scores.append(-float(i))
        types.append(1)
        i += 1
    return toks[:n], scores[:n], types[:n]


def write_tiny_vocab(w, n: int) -> None:
    """``tiny_vocab(n)`` into a GGUFWriter as llama.cpp's SPM ("llama") tokenizer
    reads it: unk 0, bos 1, eos 2, no BOS added (the ids are the case's own). One
    place for the harness's export and the tests' converter (which swaps it in for
    the checkpoint's tokenizer)."""
    toks, scores, types = tiny_vocab(n)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)


# conversion/base.py prepare_tensors: matrices the converter writes as F32 whatever
# the requested type ("Some tensor types are always in float32"), by their GGUF name
_ALWAYS_F32 = ("FFN_GATE_INP", "FFN_GATE_INP_SHEXP", "POS_EMBD", "TOKEN_TYPES", "SSM_CONV1D", "SHORTCONV_CONV",
               "TIME_MIX_FIRST", "TIME_MIX_W1", "TIME_MIX_W2", "TIME_MIX_DECAY_W1", "TIME_MIX_DECAY_W2",
               "TIME_MIX_LERP_FUSED", "POSNET_NORM1", "POSNET_NORM2", "V_ENC_EMBD_POS", "A_ENC_EMBD_POS",
               "ALTUP_CORRECT_COEF", "ALTUP_PREDICT_COEF", "SSM_CONV1D_Q", "SSM_CONV1D_K", "SSM_CONV1D_V",
               "INDEXER_PROJ")


def converter_keeps_f32(name: str) -> bool:
    """Whether the converter writes GGUF tensor ``name`` as F32 regardless of the
    requested type: ``*_norm.weight``, a name that does not end in ``.weight``, and
    the ``_ALWAYS_F32`` kinds (ggml's SSM_CONV, for one, reads only F32 kernels)."""

    if name.endswith("_norm.weight") or not name.endswith(".weight"):
        return True
    base = re.sub(r"^(blk|posnet)\.\d+\.", r"\1.{bid}.", name.removesuffix(".weight"))
    kinds = (getattr(gguf.MODEL_TENSOR, k, None) for k in _ALWAYS_F32)
    return base in {gguf.TENSOR_NAMES.get(k) for k in kinds if k is not None}


def _quantize(data: np.ndarray, weight_type: str):
    if weight_type == "f32" or data.ndim < 2:
        return data.astype(np.float32, copy=False), None  # a float32 weight is written from the model's own memory
    if weight_type == "f16":
        return data.astype(np.float16), None
    qt = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[weight_type]
    try:
        return gguf.quants.quantize(data.astype(np.float32), qt), qt
    except gguf.quants.QuantError:
        return data.astype(np.float16), None  # the converter's fallback for rows Q8_0 cannot block


def export(family, model, config, weight_type: str = "f32", seed: int = 0, variant: str | None = None,
           source=None) -> Path:
    """Write (or reuse) the GGUF for ``model`` and return its path. ``source``
    names where weights that are not the family's seeded ones came from (an
    ``--hf-model`` checkpoint's path and file stamp): part of the cache key."""

    src = cache.source_hash(*cache.family_sources(family), Path(__file__), Path(__file__).parents[2] / "families" / "base.py")
    k = cache.key("gguf", EXPORT_SCHEMA, family.name, config.to_json_string(use_diff=False), seed, weight_type,
                  variant, versions().get("gguf"), src, source,
                  # instance state that shapes the file (a test switching off a transform)
                  sorted((k, repr(v)) for k, v in vars(family).items()))
    out = cache.cache_dir() / "gguf" / f"{family.name}{'-' + variant if variant else ''}-{k}.gguf"
    if out.exists():
        cache.touch(out)  # its last use: what the cache's limit evicts by
        return out
    with atomic_path(out, suffix=".gguf") as tmp:
        _write(family, model, config, weight_type, variant, tmp)
    return out


def _write(family, model, config, weight_type: str, variant: str | None, tmp: Path, tensors=None) -> None:
    # Under a temporary name unique to this writer (harness/atomic.py): two workers
    # exporting the same key at once each write their own file, and the rename that
    # lands last wins -- a fixed ".tmp" name let one rename the other's file away.

    # use_temp_file: each tensor is spooled to disk as it is added (gguf's writer holds
    # every added array until the end otherwise: a second copy of a real model)
    w = gguf.GGUFWriter(str(tmp), family.gguf_arch, use_temp_file=True)
    family.gguf_params(w, config, variant)
    family.gguf_model_params(w, model, config, variant)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[weight_type]
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tiny_vocab(w, int(config.vocab_size))
    for name, data in (family.gguf_tensors(model, config, variant) if tensors is None else tensors):
        arr, qt = _quantize(np.asarray(data), "f32" if converter_keeps_f32(name) else weight_type)
        if qt is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export_streamed(family, config, seed: int, weight_type: str, out: Path, weights: str = "random",
                    variant: str | None = None) -> Path:
    """The GGUF ``export`` writes for the family's seeded model (``Family.build_model``
    with ``weights``), written tensor by tensor as each is drawn, never the model in
    memory: an 8B-class model in float32 is 32 GB (scripts/bench_real_size.py's
    8B-q4_k_m file: written at f16, then quantized by llama.cpp). The model is built
    on the meta device; each parameter, in the order ``init_weights`` draws them
    (``Family.init_draws``), takes its seeded value, ``realistic_apply``'s step and
    the export's conversion (``Family.gguf_hf_tensor``), and goes to the writer's
    spool file; a norm's value as HF initialised it (which ``init_value`` reads) is
    made on a CPU copy of its own small module. The tensors lie in the order drawn,
    not the export's -- llama.cpp finds them by name, and llama_model_quantize
    orders them itself (llama-model-loader.h ``weight_name_comparer``) -- with the
    same values: tests/test_gguf_stream.py holds the two files to the same tensors
    and the same quantized file. Refused (ValueError) for a family whose export or
    initialisation reads more than one parameter at a time."""

    cls = type(family)
    if (cls.gguf_tensors is not GGUFExport.gguf_tensors or cls.gguf_model_params is not GGUFExport.gguf_model_params
            or cls.init_weights is not Family.init_weights or cls.realistic_weights is not Family.realistic_weights):
        raise ValueError(f"family {family.name}: its export or initialisation is not one parameter at a time")
    kw = {} if family.experts_implementation is None else {"experts_implementation": family.experts_implementation}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32, **kw)
    if any(True for _ in model.buffers()) and any(n in model.state_dict() for n, _ in model.named_buffers()):
        raise ValueError(f"family {family.name}: its model exports buffers, which a meta model does not hold")

    def initial(name, p):
        if p.ndim >= 2:
            return p  # init_value reads a matrix's shape only
        owner = model.get_submodule(name.rpartition(".")[0])
        twin = copy.deepcopy(owner).to_empty(device="cpu")
        model._init_weights(twin)  # HF's own initialisation of that module (PreTrainedModel._init_weights)
        return getattr(twin, name.rpartition(".")[2])

    plan = family.realistic_plan(config, seed, weights) if weights in ("realistic", "trained") else None
    tmap = family.gguf_tensor_map(config)

    def tensors():
        with torch.no_grad():
            for name, _, value in family.init_draws(model, seed, initial):
                if plan is not None:
                    family.realistic_apply(name, value, plan)
                yield from family.gguf_hf_tensor(name, value.to(torch.float32).numpy(), config, variant, tmap)
                del value
        yield from family.gguf_extra_tensors(config, variant)

    out = Path(out)
    with atomic_path(out, suffix=".gguf") as tmp:
        _write(family, model, config, weight_type, variant, tmp, tensors=tensors())
    return out
