"""The weights a case runs on when llama.cpp computes with quantized ones.

``--gguf-type q4_k_m`` (any quantized type): the family's model is exported
as F32 (``gguf_export``), then quantized by llama.cpp's own
``llama_model_quantize`` (llama-cpp-python's binding of ``llama-quantize``:
the file is what a user gets, fallbacks for rows a K-quant cannot block
included). llama.cpp runs on that file; HF and impl run on ITS weights,
dequantized (``gguf.quants.dequantize``) and put back through the export run
backwards (``trace_import``) -- so every side holds the same numbers, and what
is left between them is arithmetic, not rounded weights.

``--gguf FILE``: the HF reference is built from the same file by transformers'
own GGUF loader (``load_gguf_checkpoint``: its name map, its Q/K un-permutation,
its dequantization) where it supports the arch, into a model of the config
read here; elsewhere it is the harness's reverse map. Either way impl's weights
come from the harness's reverse map, so impl vs HF also checks one reverse map
against the other.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
from pathlib import Path
import warnings

from harness.atomic import atomic_path
from harness.errors import UsageError
from harness.versions import ROOT
from harness import ggml_types
from harness.lazy import lazy
from harness.pipeline.gguf import export as gguf_export
from harness.pipeline.gguf.reader import dequantizer, open_reader
from harness.ggml_env import worker_env

torch = lazy("torch")
tg = lazy("transformers.modeling_gguf_pytorch_utils")
tlog = lazy("transformers.utils.logging")

QUANTIZE_SCHEMA = 1


def quantize(src: Path, weight_type: str, timeout: int = 600) -> Path:
    """``src`` (an F32 GGUF) quantized by ``llama_model_quantize`` to the
    ``llama_ftype`` of ``weight_type`` (cached next to it). Runs in a subprocess:
    a crash inside llama.cpp is an error, not the end of the run. ``timeout``:
    seconds it may take (an 8B-class model takes minutes)."""
    ftype = ggml_types.QUANT_FTYPES[weight_type]
    out = src.with_name(f"{src.stem}.{weight_type}.v{QUANTIZE_SCHEMA}.gguf")
    if out.exists():
        return out
    code = ("import ctypes, sys, llama_cpp as l\n"
            "p = l.llama_model_quantize_default_params()\n"
            f"p.ftype = {ftype}\np.nthread = 2\n"
            "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))\n")
    # under a temporary name unique to this writer, renamed into place (harness/atomic.py):
    # two workers quantizing one key never see each other's half-written file
    with atomic_path(out, suffix=".gguf") as tmp:

        proc = subprocess.run([sys.executable, "-c", code, str(src), str(tmp)], capture_output=True, text=True,
                              timeout=timeout, cwd=str(ROOT), env=worker_env(), process_group=0)  # Ctrl-C: the harness's
        if proc.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
            tail = " | ".join(line for line in (proc.stderr or "").strip().splitlines()[-3:] if line.strip())
            raise RuntimeError(f"llama_model_quantize to {weight_type} failed (exit {proc.returncode}): {tail}")
    return out


def export_for_case(family, model, config, weight_type: str, seed: int, variant, source=None) -> Path:
    """The GGUF llama.cpp runs for a case: the export at a float type, or the F32
    export quantized by llama.cpp."""

    if weight_type in ggml_types.FLOAT_EXPORTS:
        return gguf_export.export(family, model, config, weight_type, seed, variant, source=source)
    f32 = gguf_export.export(family, model, config, "f32", seed, variant, source=source)
    return quantize(f32, weight_type)


def file_tensors(path: Path) -> tuple[dict, dict]:
    """``({name: loader of the dequantized float32 array}, {name: type})``."""
    reader = open_reader(str(path))
    return ({t.name: dequantizer(t) for t in reader.tensors},
            {t.name: t.tensor_type.name.lower() for t in reader.tensors})


def dequantized_model(family, model, config, path: Path, variant):
    """``(model, hf_types)``: a copy of ``model`` holding the weights of the GGUF
    at ``path`` (its export, quantized), dequantized and placed back by
    ``trace_import``, and per HF tensor the types of the GGUF tensors it came from."""

    tensors, types = file_tensors(path)
    out = copy.deepcopy(model).to(torch.float32)
    provenance: dict[str, list[str]] = {}
    state = family.gguf_import_tensors(tensors, out, config, variant, str(path), provenance)
    out.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    return out, {h: {types[g] for g in gs if g in types} for h, gs in provenance.items()}


def transformers_reference(src, log=None):
    """The HF model transformers' own GGUF loader builds from ``src``'s file,
    in ``src``'s config, and how it was built; ``(None, why)`` where the loader
    does not support the arch (the reverse-mapped ``src.model`` is then the HF
    reference)."""

    arch = src.family.gguf_arch
    if getattr(src, "stream", None) is not None:
        return None, ("the harness's reverse map, one layer at a time (the model is too large to hold: "
                      "transformers' GGUF loader builds it whole)")
    if arch not in tg.GGUF_SUPPORTED_ARCHITECTURES and arch.replace("-", "_") not in tg.GGUF_SUPPORTED_ARCHITECTURES:
        return None, f"transformers' GGUF loader does not support {arch}: the harness's reverse map"
    quantized = sorted({t for t in src.tensor_types.values() if ggml_types.is_quantized(t)})
    if quantized:
        # its dequantization is gguf-py's dequantize, the one the reverse map ran: the same
        # numbers a second time (on a 135M file 18 s, and a second float32 copy of the model);
        # its name map and Q/K un-permutation are independent of the weight type and are
        # checked on float files (tests/test_gguf_files.py), and llama.cpp reads this file
        # itself -- the independent reading the three-way comparison rests on
        return None, (f"the harness's reverse map, dequantized once (the file is {', '.join(quantized)}: "
                      "transformers' GGUF loader would dequantize it again to the same numbers)")
    model = copy.deepcopy(src.model)
    try:
        with quiet_third_party():
            parsed = tg.load_gguf_checkpoint(src.path, return_tensors=True, model_to_load=model)
    except Exception as e:  # its own mapping refused the file: fall back, and say so
        return None, (f"transformers' GGUF loader refused the file ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:160]}): the harness's reverse map")
    tensors = parsed.get("tensors") or {}
    sd = model.state_dict()
    missing = [k for k in sd if k not in tensors and not _tied(model, k)]
    if missing:
        return None, (f"transformers' GGUF loader left {len(missing)} tensors unmapped ({missing[0]}, ...): "
                      "the harness's reverse map")
    model.load_state_dict({k: torch.as_tensor(v, dtype=torch.float32) for k, v in tensors.items() if k in sd},
                          strict=False)
    # where its reading and the reverse map part (a tensor it does not know: a .scale
    # llama.cpp folds in, a fused QKV, rope_freqs ...), llama.cpp decides which is the
    # file's function -- the reverse map's, which impl is checked against; the HF
    # reference then takes it too, and says why
    ours = src.model.state_dict()
    for k, v in model.state_dict().items():
        a, b = v.detach().float(), ours[k].detach().float()
        if a.shape != b.shape or not torch.allclose(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max() + 1e-30)):
            return None, (f"transformers' GGUF loader reads {k} differently from llama.cpp's graph (the reverse map): "
                          "the harness's reverse map")
    return model, "transformers' GGUF loader (load_gguf_checkpoint) into the config read here"


@contextlib.contextmanager
def quiet_third_party():
    """transformers' GGUF loader without its tqdm bar ("Converting and de-quantizing
    GGUF tensors...", written raw into the run's output: it imports tqdm.auto
    itself, so transformers' own disable_progress_bar does not reach it) and
    without its log lines and warnings: the run's output is the harness's."""

    def silent(it=None, *args, **kwargs):
        return it

    saved, level = tg.tqdm, tlog.get_verbosity()
    tg.tqdm = silent
    tlog.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tg.tqdm = saved
        tlog.set_verbosity(level)


def _tied(model, name: str) -> bool:
    emb = getattr(model.get_input_embeddings(), "weight", None)
    p = model.state_dict().get(name)
    return emb is not None and p is not None and p.data_ptr() == emb.data_ptr()


def check_weight_type(weight_type: str) -> None:
    if weight_type in ggml_types.NEEDS_IMATRIX:
        raise UsageError(f"--gguf-type {weight_type} needs an importance matrix (llama-quant.cpp refuses it "
                         f"without one); valid without: "
                         f"{', '.join(t for t in ggml_types.GGUF_TYPES if t not in ggml_types.NEEDS_IMATRIX)}")
