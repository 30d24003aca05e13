"""Engines nobody here wrote, judged as candidates: ONNX Runtime, OpenVINO and
CTranslate2 (the extra ``.[engines]``; docs/reference/candidates.md has the
table of what each passed and where each diverged).

Each is an ordinary plug-in: declared under the entry-point group
``attn_conformance.candidates`` in pyproject.toml exactly as a user's package
declares its engine, and built only on what a user's plug-in gets -- the
contract's ``LayerCall`` for a layer engine, the ``Build``'s public face
(``run.case``, ``run.family``, ``run.config``, ``run.layer_cfgs``,
``run.tokens``, ``run.base_model``, ``run.selection``, ``run.memo``) for a
whole-model one. No private name of the harness is read.

- ``ort-gqa`` (``ort_layer.py``): one decoder layer's attention half as an ONNX
  graph around ORT's own ``com.microsoft.GroupQueryAttention`` contrib op (its
  rotary, window, softcap, sinks and per-head QK norm), teacher-forced.
- ``ort-genai`` (``ort_genai.py``): the whole model from onnxruntime-genai's
  model builder, run by ONNX Runtime from the tokens, the graph's named layer
  tensors made outputs.
- ``openvino`` (``openvino_model.py``): the HF model converted by OpenVINO's
  own converter (``openvino.convert_model``) and run by its CPU plugin, the
  layer boundaries made outputs.
- ``ctranslate2`` (``ctranslate2_model.py``): the HF checkpoint converted by
  CTranslate2's own converter and run by its generator; logits only (its
  Python API returns nothing from inside the decoder).

Whole-model engines run free from the tokens; what an engine cannot express
for a family (an arch its converter refuses, a decoration its op lacks) is a
``skipped`` case in the engine's own words, never a pass and never a crash.
"""

from __future__ import annotations

import importlib
from importlib import metadata
import tempfile
from pathlib import Path

from harness.lazy import lazy
from ...errors import UsageError

tokenizers = lazy("tokenizers")
models = lazy("tokenizers.models")
pre_tokenizers = lazy("tokenizers.pre_tokenizers")
transformers = lazy("transformers")

EXTRA = "pip install -e '.[engines]'"


def require(module: str, candidate: str):
    """``module`` imported, or a one-line ``UsageError`` saying how to install it
    (a candidate whose engine is absent is bad input: exit 2, nothing run)."""

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"candidate {candidate} runs {module}, which does not import here "
                         f"({' '.join(str(e).split())[:120]}); {EXTRA}") from None


def installed(distribution: str) -> bool:
    """Whether ``distribution``'s metadata is installed (an installed engine that
    does not import is broken, not absent: its tests fail rather than skip)."""
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def checkpoint(run, with_tokenizer: bool = True):
    """The case's model as an HF checkpoint directory (what every converter
    reads): ``run.base_model`` saved with ``save_pretrained`` and, where a
    converter insists on a tokenizer (CTranslate2, onnxruntime-genai), a word-level
    one over the model's vocabulary (token ``<tN>`` is id N) -- the engines are
    fed ids, never text. Made once per case in a temporary directory removed at
    exit."""
    return run.memo("engines_checkpoint", lambda: _save_checkpoint(run, with_tokenizer))


def scratch(run, name: str):
    """A temporary directory for this case's converted model ``name`` (removed at exit)."""
    d = run.memo("engines_tmp", lambda: tempfile.TemporaryDirectory(prefix="attn-engines-"))

    p = Path(d.name) / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def _special_id(config, key: str, default: int, n: int) -> int:
    """The config's special token id where it names a token of the tiny vocabulary;
    else ``default``. A config may keep a published model's ids (far past a
    128-token vocabulary), and a special token outside the vocabulary is an added
    token: the tokenizer then has n + 1 entries, which CTranslate2's converter
    refuses ("Vocabulary has size 129 but the model expected a vocabulary of size 128")."""
    v = getattr(config, key, None)
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return v if isinstance(v, int) and 0 <= v < n else default


def _save_checkpoint(run, with_tokenizer: bool):
    d = scratch(run, "hf")
    run.base_model.save_pretrained(d)
    if with_tokenizer:
        n = int(run.config.vocab_size)
        vocab = {f"<t{i}>": i for i in range(n)}
        tk = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        special = {k: f"<t{_special_id(run.config, k + '_id', i, n)}>" for i, k in ((1, "bos_token"), (2, "eos_token"))}
        # pad named too: the converters load it with AutoTokenizer, which picks the family's
        # own class from config.json (Qwen2Tokenizer), and that class adds its default pad
        # "<|endoftext|>" as a 129th token where none is given
        transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<t0>", pad_token="<t0>", **special).save_pretrained(d)
    return d


def said(e: BaseException, limit: int = 300) -> str:
    """An engine's exception as one line (its own words, for a ``skipped`` row)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"
